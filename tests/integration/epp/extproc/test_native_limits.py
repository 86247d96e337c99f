"""The native transport's flow control, flood limits and keepalive (limits.py), from raw
client connections on loopback: a reader that does not read holds the client back, each
known HTTP/2 flood ends the connection with GOAWAY ENHANCE_YOUR_CALM, and a client
that does not answer keepalive PINGs is closed. Every wait is on a frame or an event;
where a limit is a rate, the server's clock is a fake."""

from __future__ import annotations

import asyncio
import itertools
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    Frame,
    GoAwayFrame,
    HeadersFrame,
    PingFrame,
    RstStreamFrame,
    SettingsFrame,
    WindowUpdateFrame,
)

from epp.extproc.native import limits
from epp.extproc.native.connection import Connection
from epp.extproc.native.grpc import Call, GrpcServer, Method
from epp.extproc.native.health import Health
from epp.extproc.native.streams import STREAM_WINDOW
from tests.support.h2wire import (
    HEALTH_CHECK,
    RawClient,
    grpc_message,
    grpc_messages,
    health_request,
    request_headers,
)
from tests.support.wait import until

HOLD = "/test.Hold/Count"  # reads nothing until the test opens the gate, then counts
ECHO = "/test.Echo/Echo"
FLOW_CONTROL_ERROR, ENHANCE_YOUR_CALM, NO_ERROR = 3, 11, 0


class _Raw:
    def __init__(self, data: bytes) -> None:
        self.data = data

    def SerializeToString(self) -> bytes:
        return self.data


@dataclass
class Served:
    port: int
    gate: asyncio.Event
    grpc: GrpcServer
    connections: list[Connection] = field(default_factory=list)


async def _echo(call: Call[bytes]) -> None:
    while (message := await call.recv()) is not None:
        await call.send(_Raw(message))


def _server(gate: asyncio.Event) -> GrpcServer:
    async def hold(call: Call[bytes]) -> None:
        await gate.wait()
        count = 0
        while await call.recv() is not None:
            count += 1
        await call.send(_Raw(str(count).encode()))

    health = Health()
    health.set(True, ["liveness"])
    methods = {HOLD: Method(bytes, hold), ECHO: Method(bytes, _echo), **health.methods()}
    return GrpcServer(methods, 64 * 1024 * 1024)


@pytest.fixture
async def serve() -> AsyncIterator[Callable[..., Any]]:
    """Start a server of this package whose connections take ``options`` (keepalive
    times, a clock) and whose listening socket has ``sndbuf`` (inherited by accepted
    sockets) when given."""
    servers: list[tuple[asyncio.Server, GrpcServer]] = []

    async def start(sndbuf: int | None = None, **options: Any) -> Served:
        gate = asyncio.Event()
        grpc = _server(gate)
        served = Served(0, gate, grpc)

        def connection() -> Connection:
            conn = Connection(grpc.open_stream, lambda _: None, **options)
            served.connections.append(conn)
            return conn

        server = await asyncio.get_running_loop().create_server(connection, "127.0.0.1", 0)
        if sndbuf is not None:
            server.sockets[0].setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
        servers.append((server, grpc))
        served.port = server.sockets[0].getsockname()[1]
        return served

    yield start
    for server, grpc in servers:
        server.close()
        for call in list(grpc.calls):
            assert call.task is not None
            call.task.cancel()


async def _frames_until_ping_ack(client: RawClient, payload: bytes) -> list[Frame]:
    """Send a PING and collect what the server sends before its ack: whatever the frames
    sent before the PING made the server queue is in there (it answers in order)."""
    client.send(PingFrame(0, opaque_data=payload))
    seen = []
    while True:
        frame = await client.frame()
        assert frame is not None, "closed before the PING ack"
        if isinstance(frame, PingFrame) and "ACK" in frame.flags:
            assert frame.opaque_data == payload
            return seen
        seen.append(frame)


def _window_filling_messages(stream_id: int) -> list[DataFrame]:
    """STREAM_WINDOW bytes of whole 4 KiB messages, four to a DATA frame."""
    message = grpc_message(b"m" * (4096 - 5))
    frames_needed = STREAM_WINDOW // (4 * len(message))
    return [DataFrame(stream_id, data=message * 4) for _ in range(frames_needed)]


async def test_a_reader_that_does_not_read_holds_the_client_back(
    serve: Callable[..., Any],
) -> None:
    served = await serve()
    client = await RawClient.open(served.port)
    client.send(client.headers(1, request_headers(HOLD)))
    client.send(*_window_filling_messages(1))  # the whole stream window, nothing read
    before = await _frames_until_ping_ack(client, b"unread!!")
    updates = [f for f in before if isinstance(f, WindowUpdateFrame) and f.stream_id != 0]
    assert updates == [], "credit returned for bytes the handler has not read"
    served.gate.set()  # the handler reads them all: credit comes back for stream 1
    update = await client.until(
        lambda f: isinstance(f, WindowUpdateFrame) and f.stream_id == 1, "stream credit"
    )
    assert update.window_increment >= STREAM_WINDOW // 2
    client.send(DataFrame(1, flags=["END_STREAM"]))
    headers, data = await client.response(1)
    assert headers["grpc-status"] == "0"
    assert grpc_messages(data) == [str(STREAM_WINDOW // 4096).encode()]


async def test_past_the_unread_window_the_stream_is_reset(serve: Callable[..., Any]) -> None:
    served = await serve()
    client = await RawClient.open(served.port)
    client.send(client.headers(1, request_headers(HOLD)))
    client.send(*_window_filling_messages(1))
    client.send(DataFrame(1, data=b"x"))  # one byte past what it was allowed
    rst = await client.until(lambda f: isinstance(f, RstStreamFrame), "RST_STREAM")
    assert (rst.stream_id, rst.error_code) == (1, FLOW_CONTROL_ERROR)
    await until(lambda: not served.grpc.calls, "the handler cancelled")
    # the connection lives on, its window credited with what the reset stream held
    client.call(3, HEALTH_CHECK, health_request("liveness"))
    headers, _ = await client.response(3)
    assert headers["grpc-status"] == "0"


async def test_a_message_larger_than_the_window_completes_while_its_reader_waits(
    serve: Callable[..., Any],
) -> None:
    """Credited as it arrives (the handler waits in recv), in 16 KB frames that never
    exceed the window the client was given."""
    served = await serve()
    client = await RawClient.open(served.port)
    message = grpc_message(b"L" * (STREAM_WINDOW + 100_000))
    client.send(client.headers(1, request_headers(ECHO)))
    window, at = STREAM_WINDOW, 0
    while at < len(message):
        if window == 0:
            update = await client.until(
                lambda f: isinstance(f, WindowUpdateFrame) and f.stream_id == 1, "credit"
            )
            window += update.window_increment
            continue
        piece = message[at : at + min(16_384, window)]
        client.send(DataFrame(1, data=piece))
        window -= len(piece)
        at += len(piece)
    client.send(DataFrame(1, flags=["END_STREAM"]))
    headers, data = await client.response(1)
    assert headers["grpc-status"] == "0"
    assert grpc_messages(data) == [b"L" * (STREAM_WINDOW + 100_000)]


def _frozen() -> float:
    return 0.0


async def _ended_calm(client: RawClient) -> list[Frame]:
    frames = await client.closed()
    assert isinstance(frames[-1], GoAwayFrame), frames[-3:]
    assert frames[-1].error_code == ENHANCE_YOUR_CALM, frames[-1].additional_data
    return frames


async def test_ping_flood(serve: Callable[..., Any]) -> None:
    served = await serve(clock=_frozen)  # no refill: the burst is all there is
    client = await RawClient.open(served.port)
    burst = [PingFrame(0, opaque_data=i.to_bytes(8, "big")) for i in range(limits.CONTROL_BURST)]
    client.send(*burst)  # as many as the burst allows: all answered
    for i in range(limits.CONTROL_BURST):
        ack = await client.until(lambda f: isinstance(f, PingFrame), "ping ack")
        assert ack.opaque_data == i.to_bytes(8, "big")
    client.send(PingFrame(0, opaque_data=b"one more"))
    frames = await _ended_calm(client)
    assert not any(isinstance(f, PingFrame) for f in frames)


async def test_settings_flood(serve: Callable[..., Any]) -> None:
    served = await serve(clock=_frozen)
    client = await RawClient.open(served.port)
    client.send(*(SettingsFrame(0) for _ in range(limits.CONTROL_BURST + 1)))
    frames = await _ended_calm(client)
    acks = [f for f in frames if isinstance(f, SettingsFrame) and "ACK" in f.flags]
    assert len(acks) == limits.CONTROL_BURST + 1  # the preface's, then the burst


async def test_a_steady_ping_rate_is_not_a_flood(serve: Callable[..., Any]) -> None:
    """Each PING a second apart on the server's clock: the bucket refills faster than
    they come, so ten bursts' worth are all answered."""
    ticks = itertools.count()
    served = await serve(clock=lambda: float(next(ticks)))
    client = await RawClient.open(served.port)
    total = 10 * limits.CONTROL_BURST
    client.send(*(PingFrame(0, opaque_data=b"steady!!") for _ in range(total)))
    for _ in range(total):
        await client.until(lambda f: isinstance(f, PingFrame), "ping ack")
    client.call(1, HEALTH_CHECK, health_request("liveness"))
    headers, _ = await client.response(1)
    assert headers["grpc-status"] == "0"


async def test_empty_frames_flood(serve: Callable[..., Any]) -> None:
    served = await serve()
    client = await RawClient.open(served.port)
    client.send(client.headers(1, request_headers(ECHO)))
    client.send(*(DataFrame(1) for _ in range(limits.MAX_EMPTY_FRAMES)))  # allowed
    client.send(DataFrame(1, data=grpc_message(b"real"), flags=["END_STREAM"]))
    headers, data = await client.response(1)
    assert headers["grpc-status"] == "0" and grpc_messages(data) == [b"real"]
    client.send(client.headers(3, request_headers(ECHO)))
    client.send(*(DataFrame(3) for _ in range(limits.MAX_EMPTY_FRAMES + 1)))
    await _ended_calm(client)


async def test_continuation_flood(serve: Callable[..., Any]) -> None:
    served = await serve()
    client = await RawClient.open(served.port)
    client.send(HeadersFrame(1, data=b"\x82"))  # no END_HEADERS
    client.send(*(ContinuationFrame(1, data=b"\x86") for _ in range(limits.MAX_CONTINUATIONS + 1)))
    await _ended_calm(client)
    client = await RawClient.open(served.port)  # empty ones count as empty frames
    client.send(HeadersFrame(1, data=b"\x82"))
    client.send(*(ContinuationFrame(1) for _ in range(limits.MAX_EMPTY_FRAMES + 1)))
    await _ended_calm(client)


async def test_rapid_reset(serve: Callable[..., Any]) -> None:
    served = await serve()
    client = await RawClient.open(served.port)
    opened = []
    for i in range(limits.RAPID_RESETS):
        stream_id = 1 + 2 * i
        opened += [client.headers(stream_id, request_headers(ECHO)), RstStreamFrame(stream_id)]
    client.send(*opened)
    frames = await _ended_calm(client)
    assert frames[-1].last_stream_id == 2 * limits.RAPID_RESETS - 1
    await until(lambda: not served.grpc.calls, "every handler ended")


async def test_answered_streams_do_not_count_as_rapid_resets(serve: Callable[..., Any]) -> None:
    """What Envoy does at the end of each request (END_STREAM, then RST_STREAM before
    the trailers) is no attack, however often."""
    served = await serve()
    client = await RawClient.open(served.port)
    for i in range(limits.RAPID_RESETS + 1):
        stream_id = 1 + 2 * i
        client.call(stream_id, ECHO, grpc_message(b"hi"), end=False)
        echo = await client.until(lambda f: isinstance(f, DataFrame), "echo")
        assert echo.stream_id == stream_id
        client.send(DataFrame(stream_id, flags=["END_STREAM"]), RstStreamFrame(stream_id))
    # (the response headers went by undecoded: the connection is checked with a PING)
    after = await _frames_until_ping_ack(client, b"stillok!")
    assert not any(isinstance(f, GoAwayFrame) for f in after)
    assert len(served.connections) == 1 and not served.connections[0].closed.is_set()


async def test_control_frames_piling_up_unread_end_the_connection(
    serve: Callable[..., Any],
) -> None:
    """A client that sends PINGs and reads nothing: once the sockets' buffers (made
    small) are full, the acks queue; past MAX_CONTROL_BACKLOG the server gives up on it
    (a rate that never runs out, so the backlog is what ends it)."""
    ticks = itertools.count()
    served = await serve(sndbuf=4096, clock=lambda: float(next(ticks)))
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", served.port))
    client = RawClient(*await asyncio.open_connection(sock=sock))
    client.send_bytes(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + SettingsFrame(0).serialize())
    flood = PingFrame(0, opaque_data=b"unread!!").serialize() * 1000
    sent = 0
    while not served.connections or not served.connections[0].closed.is_set():
        assert sent <= 20 * limits.MAX_CONTROL_BACKLOG, "never cut off"
        client.send_bytes(flood)
        sent += 1000
        try:
            await client.writer.drain()
        except ConnectionError:  # cut off while writing
            break
        await asyncio.sleep(0)  # the server (on this loop) reads on
    await served.connections[0].closed.wait()
    frames = await client.closed()
    acks = [f for f in frames if isinstance(f, PingFrame)]
    assert len(acks) < sent


async def test_keepalive_ping_unanswered_ends_the_connection(serve: Callable[..., Any]) -> None:
    served = await serve(keepalive_time=0.05, keepalive_timeout=0.05)
    client = await RawClient.open(served.port)
    client.send(client.headers(1, request_headers(ECHO)))  # a stream open, then silence
    ping = await client.until(lambda f: isinstance(f, PingFrame), "keepalive PING")
    assert "ACK" not in ping.flags
    frames = await client.closed()
    assert isinstance(frames[-1], GoAwayFrame) and frames[-1].error_code == NO_ERROR
    assert b"keepalive" in frames[-1].additional_data


async def test_keepalive_ping_answered_keeps_the_connection(serve: Callable[..., Any]) -> None:
    served = await serve(keepalive_time=0.05, keepalive_timeout=60)
    client = await RawClient.open(served.port)
    client.send(client.headers(1, request_headers(ECHO)))
    for _ in range(3):  # answered each time: another one comes, no GOAWAY
        ping = await client.until(lambda f: isinstance(f, PingFrame | GoAwayFrame), "PING")
        assert isinstance(ping, PingFrame) and "ACK" not in ping.flags
        client.send(PingFrame(0, opaque_data=ping.opaque_data, flags=["ACK"]))
    client.send(DataFrame(1, data=grpc_message(b"alive"), flags=["END_STREAM"]))
    headers, data = await client.response(1)
    assert headers["grpc-status"] == "0" and grpc_messages(data) == [b"alive"]
