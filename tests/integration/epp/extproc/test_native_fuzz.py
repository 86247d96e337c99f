"""Frame-level fuzzing of the native transport: seeded, so every case replays. Each case
opens a connection, sends a random mix of valid, malformed, truncated, oversized and
out-of-order frames, a PING, then half-closes. Whatever it sent, the server must answer
with frames, a stream error or a connection error and close, never crash (an exception
out of the protocol is logged at ERROR by asyncio) and never hang (the test's own
timeout is the only bound); afterwards no handler is left running, no request is left
in flight, and a new connection is served.

``EPP_FUZZ_CASES`` sets how many seeds run (default 150, a few seconds)."""

from __future__ import annotations

import logging
import os
import random
import struct
from collections.abc import AsyncIterator

import pytest
from hpack import Encoder
from hyperframe.frame import GoAwayFrame, HeadersFrame, PingFrame, RstStreamFrame

from epp.extproc.native.server import NativeTransport
from epp.router import Router
from tests.support import extproc as m
from tests.support.h2wire import (
    EXT_PROC,
    HEALTH_CHECK,
    RawClient,
    grpc_message,
    health_request,
    request_headers,
)
from tests.support.native import BODY, serving
from tests.support.wait import until

CASES = int(os.environ.get("EPP_FUZZ_CASES", "150"))
DATA, HEADERS, PRIORITY, RST, SETTINGS, PUSH, PING, GOAWAY, WINDOW, CONT = range(10)


def frame(kind: int, flags: int, sid: int, payload: bytes, length: int | None = None) -> bytes:
    size = len(payload) if length is None else length
    return struct.pack(">HBBBL", size >> 8, size & 0xFF, kind, flags, sid) + payload


class Case:
    """One case's frames, drawn from ``rng``; a client-side HPACK encoder whose state
    may drift from the server's (a block the server never decodes), as a fuzzer's would."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.encoder = Encoder()
        self.next_id = 1

    def stream_id(self) -> int:
        r = self.rng.random()
        if r < 0.5:
            return max(1, self.next_id - 2)  # the stream just opened
        if r < 0.6:
            return 0
        if r < 0.7:
            return self.rng.randrange(2, 40, 2)  # even: the server's, never opened
        if r < 0.8:
            return self.next_id + 2 * self.rng.randrange(1, 5)  # idle
        return self.rng.randrange(0, 2**31)

    def payload(self, low: int = 0, high: int = 64) -> bytes:
        return self.rng.randbytes(self.rng.randrange(low, high))

    def opening(self) -> bytes:
        """A well-formed request stream (health or ext_proc), perhaps left open."""
        sid = self.next_id
        self.next_id += 2
        if self.rng.random() < 0.5:
            path, body = HEALTH_CHECK, health_request(self.rng.choice(["", "liveness", "x"]))
        else:
            msgs = [m.request_headers(), m.request_body(BODY, self.rng.random() < 0.5)]
            path = EXT_PROC
            body = b"".join(grpc_message(x.SerializeToString()) for x in msgs)
        block = self.encoder.encode(request_headers(path))
        end = 1 if self.rng.random() < 0.5 else 0
        cut = self.rng.randrange(len(body) + 1)
        return (
            frame(HEADERS, 0x4, sid, block)
            + frame(DATA, 0, sid, body[:cut])
            + frame(DATA, end, sid, body[cut:])
        )

    def junk(self) -> bytes:
        """One frame that breaks some rule (or is merely odd)."""
        rng = self.rng
        flags = rng.choice([0, 0x1, 0x4, 0x5, 0x8, 0x20, 0x2D, rng.randrange(256)])
        kind = rng.choice(
            [DATA, HEADERS, PRIORITY, RST, SETTINGS, PUSH, PING, GOAWAY, WINDOW, CONT, 0x0A, 0xEE]
        )
        # mostly the stream the type belongs on, so the rules past that one get reached
        on_connection = kind in (SETTINGS, PING, GOAWAY) and rng.random() < 0.8
        sid = 0 if on_connection else self.stream_id()
        sizes = {PRIORITY: 5, RST: 4, PING: 8, WINDOW: 4}
        if kind == WINDOW and rng.random() < 0.5:
            payload = struct.pack(">L", rng.choice([0, 1, 2**31 - 1, rng.randrange(2**32)]))
        elif kind in sizes:  # mostly the size the type needs, else any
            payload = rng.randbytes(sizes[kind] if rng.random() < 0.6 else rng.randrange(12))
        elif kind == SETTINGS:
            values = [0, 1, 2**31, rng.randrange(2**32)]
            payload = b"".join(
                struct.pack(">HL", rng.randrange(0, 8), rng.choice(values))
                for _ in range(rng.randrange(0, 4))
            ) + rng.randbytes(rng.choice([0, 0, 1, 5]))
        elif kind in (HEADERS, CONT) and rng.random() < 0.5:
            payload = self.encoder.encode(request_headers(rng.choice([HEALTH_CHECK, "/x", ""])))
        else:
            payload = self.payload()
        r = rng.random()
        if r < 0.1:  # the length says more than follows: the rest of the case is inside it
            return frame(kind, flags, sid, payload, len(payload) + rng.randrange(1, 100))
        if r < 0.15:  # oversized: past any limit the server advertised
            return frame(kind, flags, sid, b"", rng.choice([2**24 - 1, 2**20 + 1]))
        return frame(kind, flags, sid, payload)

    def frames(self) -> bytes:
        parts = []
        for _ in range(self.rng.randrange(1, 12)):
            parts.append(self.opening() if self.rng.random() < 0.3 else self.junk())
        if self.rng.random() < 0.2:  # a cut at any byte
            raw = b"".join(parts)
            return raw[: self.rng.randrange(len(raw) + 1)]
        return b"".join(parts)


@pytest.fixture
async def epp() -> AsyncIterator[tuple[NativeTransport, Router, int]]:
    async with serving() as served:
        yield served


@pytest.mark.timeout(600)
async def test_random_frames_get_an_answer_never_a_crash_or_a_hang(
    epp: tuple[NativeTransport, Router, int], caplog: pytest.LogCaptureFixture
) -> None:
    transport, router, port = epp
    caplog.set_level(logging.WARNING)
    seen: set[str] = set()
    for seed in range(CASES):
        case = Case(random.Random(seed))
        client = await RawClient.open(port)
        client.send_bytes(case.frames() + frame(PING, 0, 0, b"fuzzping"))
        client.writer.write_eof()
        # the server closes: after a GOAWAY, or at the client's EOF
        for answer in await client.closed():
            if isinstance(answer, GoAwayFrame | RstStreamFrame):
                seen.add(f"{type(answer).__name__} {answer.error_code}")
            elif isinstance(answer, PingFrame) and answer.opaque_data == b"fuzzping":
                seen.add("ping acked")
            elif isinstance(answer, HeadersFrame) and "END_STREAM" in answer.flags:
                seen.add("a call answered")
        await client.close()
        errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert not errors, f"seed {seed}: {errors}"
    # the cases reach every kind of answer (a fuzzer the server rejects at once proves
    # nothing)
    assert {
        "ping acked",
        "a call answered",
        "GoAwayFrame 0",  # NO_ERROR: closing after the client's EOF or GOAWAY
        "GoAwayFrame 1",  # PROTOCOL_ERROR
        "GoAwayFrame 6",  # FRAME_SIZE_ERROR
        "RstStreamFrame 5",  # STREAM_CLOSED
    } <= seen, seen
    await until(lambda: transport.open_calls == 0, "every handler ended")
    await until(lambda: router.datastore.total_in_flight() == 0, "nothing left in flight")
    client = await RawClient.open(port)
    client.call(1, HEALTH_CHECK, health_request("liveness"))
    headers, _ = await client.response(1)
    assert headers["grpc-status"] == "0"
    await client.close()
