"""Idle timeouts by phase, through the real Envoy (``full`` processing): a stream whose
server freezes (SIGSTOP) after its first bytes is ended by the EPP within the chunk
timeout with an SSE error event, its in-flight count goes back to zero and the stall
is counted; a server slow before its first byte (a long prefill) is left alone."""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Iterator

import orjson
import pytest

from epp.extproc.stall import STALL_CODE
from epp_harness.stack import LocalStack
from tests.e2e.conftest import ephemeral
from tests.support.http import epp_in_flight, metric_samples, open_raw_post
from tests.support.transports import transports
from tests.support.wait import wait_for

pytestmark = pytest.mark.e2e

CHUNK_S = 1.0  # the EPP's between-chunk timeout in this test
FIRST_BYTE_S = 30.0  # Envoy's per-attempt idle timeout on streams: the first-byte budget
PREFILL_MS = 3000  # the slow server's prefill: longer than CHUNK_S, within FIRST_BYTE_S
SAFETY_S = 60.0  # outer bound of every wait: only a safety net


def _stack(sim_args: list[str], epp_args: tuple[str, ...] = ()) -> Iterator[LocalStack]:
    opts = ephemeral(
        servers=1,
        sim_args=sim_args,
        epp_args=list(epp_args),
        stream_idle_timeout_s=FIRST_BYTE_S,
        stream_chunk_timeout_s=CHUNK_S,
    )
    with LocalStack(opts) as s:
        yield s


@pytest.fixture(params=transports())
def stack(request: pytest.FixtureRequest) -> Iterator[LocalStack]:
    # each transport sends the stalled stream's end its own way (epp/extproc/*_transport.py)
    yield from _stack(["--time-scale", "0.2"], ("--transport", request.param))


@pytest.fixture
def slow_prefill() -> Iterator[LocalStack]:
    yield from _stack(["--time-scale", "1", "--prefill-overhead-ms", str(PREFILL_MS)])


def _stream(stack: LocalStack, max_tokens: int) -> socket.socket:
    body = orjson.dumps(
        {"model": "sim-model", "prompt": "hello", "max_tokens": max_tokens, "stream": True}
    )
    sock = open_raw_post(stack.envoy_url, "/v1/completions", body)
    sock.settimeout(SAFETY_S)
    return sock


def _read_until(sock: socket.socket, marker: bytes) -> bytes:
    got = b""
    while marker not in got:
        chunk = sock.recv(65536)
        assert chunk, got
        got += chunk
    return got


def _read_to_end(sock: socket.socket) -> bytes:
    """The rest of a chunked response: up to its last chunk (or the connection's end)."""
    got = b""
    while not got.endswith(b"0\r\n\r\n") and (chunk := sock.recv(65536)):
        got += chunk
    return got


def _stalls(stack: LocalStack) -> float:
    return metric_samples(f"{stack.epp_http_url}/metrics").get("epp_stream_stalls_total", 0.0)


def test_a_stream_frozen_mid_way_ends_with_an_error_event(stack: LocalStack) -> None:
    pid = stack.sims[0].pid
    with _stream(stack, max_tokens=2000) as sock:
        _read_until(sock, b"data:")
        assert epp_in_flight(stack.epp_http_url) == 1
        os.kill(pid, signal.SIGSTOP)
        frozen_at = time.monotonic()
        try:
            rest = _read_to_end(sock)
            ended_after = time.monotonic() - frozen_at
            # the client got an error event and a properly ended response, not a cut
            # connection, and well before Envoy's own timeout would have cut it
            assert b"event: error\ndata: " in rest, rest[-200:]
            event = rest.split(b"event: error\ndata: ", 1)[1].split(b"\n\n", 1)[0]
            error = orjson.loads(event)["error"]
            assert error["code"] == STALL_CODE and error["type"] == "timeout", error
            assert rest.endswith(b"0\r\n\r\n") and b"[DONE]" not in rest
            assert ended_after < FIRST_BYTE_S / 2, ended_after
            wait_for(
                lambda: epp_in_flight(stack.epp_http_url) == 0,
                timeout=SAFETY_S,
                what="in-flight count back to zero",
            )
            wait_for(lambda: _stalls(stack) == 1, timeout=SAFETY_S, what="the stall counted")
        finally:
            os.kill(pid, signal.SIGCONT)
    print(f"stream ended {ended_after:.2f} s after the freeze")


def test_a_long_prefill_is_not_cut(slow_prefill: LocalStack) -> None:
    with _stream(slow_prefill, max_tokens=8) as sock:
        started = time.monotonic()
        response = _read_to_end(sock)
        took = time.monotonic() - started
    assert took > CHUNK_S  # the first byte came later than the chunk timeout
    assert b"data: [DONE]" in response and b"event: error" not in response, response[-300:]
    assert _stalls(slow_prefill) == 0
