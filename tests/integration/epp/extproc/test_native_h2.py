"""The native transport as an HTTP/2 server (RFC 9113), checked frame by frame from real
client connections on loopback: the ``h2`` library's client state machine where a
well-behaved client is meant, raw frames (hyperframe) where the client breaks a rule.
The server runs on the test's event loop, so its state (in-flight requests) is read
directly."""

from __future__ import annotations

import asyncio
import random
import ssl
from collections.abc import AsyncIterator
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.settings
import pytest
from envoy.service.ext_proc.v3.external_processor_pb2 import ProcessingResponse
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    GoAwayFrame,
    HeadersFrame,
    PingFrame,
    RstStreamFrame,
    SettingsFrame,
    WindowUpdateFrame,
)

from epp.extproc.certreload import LiveCertificate
from epp.extproc.native.connection import Connection
from epp.extproc.native.grpc import Call, GrpcServer, Method
from epp.extproc.native.health import Health
from epp.extproc.native.server import NativeTransport
from epp.extproc.native.streams import STREAM_WINDOW
from epp.extproc.tls import self_signed
from epp.router import Router
from tests.support import extproc as m
from tests.support.h2wire import (
    EXT_PROC,
    HEALTH_CHECK,
    RawClient,
    grpc_message,
    grpc_messages,
    health_request,
    request_headers,
)
from tests.support.native import BODY, make_router, serving
from tests.support.wait import until

ECHO = "/test.Echo/Echo"
MAX_STREAMS = 3
# error codes (RFC 9113 §7)
NO_ERROR, PROTOCOL_ERROR, FLOW_CONTROL_ERROR, STREAM_CLOSED, FRAME_SIZE_ERROR = 0, 1, 3, 5, 6
REFUSED_STREAM, CANCEL = 7, 8


class _Raw:
    def __init__(self, data: bytes) -> None:
        self.data = data

    def SerializeToString(self) -> bytes:
        return self.data


async def _echo(call: Call[bytes]) -> None:
    while (message := await call.recv()) is not None:
        await call.send(_Raw(message))


@pytest.fixture
async def echo_port() -> AsyncIterator[int]:
    """A gRPC server of this package (echo + health) allowing MAX_STREAMS streams."""
    health = Health()
    health.set(True, ["", "liveness"])
    grpc = GrpcServer({ECHO: Method(bytes, _echo), **health.methods()}, 64 * 1024 * 1024)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: Connection(grpc.open_stream, lambda _: None, max_streams=MAX_STREAMS),
        "127.0.0.1",
        0,
    )
    yield server.sockets[0].getsockname()[1]
    server.close()
    for call in list(grpc.calls):
        assert call.task is not None
        call.task.cancel()


@pytest.fixture
async def epp() -> AsyncIterator[tuple[NativeTransport, Router, int]]:
    async with serving() as served:
        yield served


class H2Client:
    """The h2 library's client over an asyncio connection."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.events: list[Any] = []

    @classmethod
    async def open(cls, port: int, window: int | None = None) -> H2Client:
        client = cls(*await asyncio.open_connection("127.0.0.1", port))
        client.conn.initiate_connection()
        if window is not None:
            client.conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window})
        client.flush()
        return client

    def flush(self) -> None:
        self.writer.write(self.conn.data_to_send())

    async def until(self, kind: type, stream_id: int | None = None) -> Any:
        while True:
            for i, event in enumerate(self.events):
                if isinstance(event, kind) and (
                    stream_id is None or getattr(event, "stream_id", None) == stream_id
                ):
                    del self.events[: i + 1]
                    return event
            data = await self.reader.read(1 << 20)
            assert data, f"connection closed while waiting for {kind.__name__}"
            for event in self.conn.receive_data(data):
                if isinstance(event, h2.events.DataReceived):
                    self.conn.acknowledge_received_data(
                        event.flow_controlled_length, event.stream_id
                    )
                self.events.append(event)
            self.flush()

    async def call(self, path: str, body: bytes) -> tuple[dict[bytes, bytes], bytes]:
        """A whole unary or client-streaming call: (headers + trailers, DATA)."""
        stream_id = self.conn.get_next_available_stream_id()
        self.conn.send_headers(stream_id, request_headers(path))
        self.flush()
        await self.send(stream_id, body, end=True)
        headers: dict[bytes, bytes] = {}
        data = bytearray()
        while True:
            event = await self.until(object, stream_id)
            if isinstance(event, h2.events.ResponseReceived | h2.events.TrailersReceived):
                headers.update(event.headers)
            elif isinstance(event, h2.events.DataReceived):
                data += event.data
            elif isinstance(event, h2.events.StreamEnded):
                return headers, bytes(data)

    async def send(self, stream_id: int, body: bytes, end: bool) -> None:
        """``body`` as DATA, waiting for the server's WINDOW_UPDATEs as needed."""
        view = memoryview(body)
        while view:
            room = min(
                self.conn.local_flow_control_window(stream_id),
                self.conn.max_outbound_frame_size,
                len(view),
            )
            if room <= 0:
                await self.until(h2.events.WindowUpdated)
                continue
            self.conn.send_data(stream_id, bytes(view[:room]))
            view = view[room:]
            self.flush()
        if end:
            self.conn.end_stream(stream_id)
            self.flush()


async def test_preface_then_settings_and_their_ack(echo_port: int) -> None:
    client = await RawClient.open(echo_port)
    first = await client.frame()
    assert isinstance(first, SettingsFrame) and "ACK" not in first.flags
    assert first.settings[SettingsFrame.MAX_CONCURRENT_STREAMS] == MAX_STREAMS
    assert first.settings[SettingsFrame.INITIAL_WINDOW_SIZE] == STREAM_WINDOW
    await client.until(lambda f: isinstance(f, SettingsFrame) and "ACK" in f.flags, "ack")
    await client.close()


async def test_a_client_that_is_not_http2_is_closed(echo_port: int) -> None:
    client = await RawClient.open(echo_port, preface=False)
    client.send_bytes(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    frames = await client.closed()
    assert [type(f) for f in frames][-1] is GoAwayFrame
    assert frames[-1].error_code == PROTOCOL_ERROR


async def test_ping_is_acked_with_its_payload(echo_port: int) -> None:
    client = await H2Client.open(echo_port)
    client.conn.ping(b"12345678")
    client.flush()
    ack = await client.until(h2.events.PingAckReceived)
    assert ack.ping_data == b"12345678"


async def test_a_large_message_crosses_both_windows_both_ways(echo_port: int) -> None:
    """10 MB in (more than the server's stream window: it must send WINDOW_UPDATEs as it
    reads) and 10 MB back to a client whose windows are 64 KB (the server must wait for
    the client's WINDOW_UPDATEs)."""
    payload = random.Random(1).randbytes(10 * 1024 * 1024)
    client = await H2Client.open(echo_port, window=65_535)
    headers, data = await client.call(ECHO, grpc_message(payload))
    assert headers[b"grpc-status"] == b"0"
    assert grpc_messages(data) == [payload]


async def test_many_small_messages_in_one_frame_and_one_message_in_many(echo_port: int) -> None:
    messages = [bytes([i]) * i for i in range(1, 200)]
    client = await H2Client.open(echo_port)
    _, data = await client.call(ECHO, b"".join(grpc_message(x) for x in messages))
    assert grpc_messages(data) == messages
    raw = await RawClient.open(echo_port)
    body = grpc_message(b"abc" * 1000)
    raw.send(raw.headers(1, request_headers(ECHO)))
    raw.send(*(DataFrame(1, data=body[i : i + 7]) for i in range(0, len(body), 7)))
    raw.send(DataFrame(1, flags=["END_STREAM"]))
    headers, data = await raw.response(1)
    assert headers["grpc-status"] == "0" and grpc_messages(data) == [b"abc" * 1000]


async def test_header_block_across_continuation_frames(echo_port: int) -> None:
    client = await RawClient.open(echo_port)
    block = client.block(request_headers(HEALTH_CHECK, [("x-big", "v" * 40_000)]))
    pieces = [block[i : i + 10_000] for i in range(0, len(block), 10_000)]
    client.send(HeadersFrame(1, data=pieces[0]))
    client.send(*(ContinuationFrame(1, data=p) for p in pieces[1:-1]))
    client.send(ContinuationFrame(1, data=pieces[-1], flags=["END_HEADERS"]))
    client.send(DataFrame(1, data=health_request("liveness"), flags=["END_STREAM"]))
    headers, data = await client.response(1)
    assert headers["grpc-status"] == "0" and grpc_messages(data) == [b"\x08\x01"]


async def test_a_frame_between_headers_and_continuation_ends_the_connection(
    echo_port: int,
) -> None:
    client = await RawClient.open(echo_port)
    block = client.block(request_headers(HEALTH_CHECK))
    client.send(HeadersFrame(1, data=block[:5]), PingFrame(0, opaque_data=b"x" * 8))
    frames = await client.closed()
    assert isinstance(frames[-1], GoAwayFrame) and frames[-1].error_code == PROTOCOL_ERROR


async def test_padded_headers_and_data(echo_port: int) -> None:
    client = await RawClient.open(echo_port)
    block = client.block(request_headers(HEALTH_CHECK))
    head = HeadersFrame(1, data=block, flags=["END_HEADERS", "PADDED"])
    head.pad_length = 17
    body = DataFrame(1, data=health_request("liveness"), flags=["END_STREAM", "PADDED"])
    body.pad_length = 200
    client.send(head, body)
    headers, data = await client.response(1)
    assert headers["grpc-status"] == "0" and grpc_messages(data) == [b"\x08\x01"]


async def test_padding_longer_than_the_frame_ends_the_connection(echo_port: int) -> None:
    client = await RawClient.open(echo_port)
    client.send(client.headers(1, request_headers(ECHO)))
    # a DATA frame of 3 bytes whose pad length says 10
    client.send_bytes(b"\x00\x00\x03\x00\x08\x00\x00\x00\x01" + b"\x0a\x00\x00")
    frames = await client.closed()
    assert isinstance(frames[-1], GoAwayFrame) and frames[-1].error_code == PROTOCOL_ERROR


async def test_client_reset_mid_stream_releases_the_request(
    epp: tuple[NativeTransport, Router, int],
) -> None:
    _, router, port = epp
    client = await RawClient.open(port)
    body = m.request_headers().SerializeToString(), m.request_body(BODY, True).SerializeToString()
    client.send(client.headers(1, request_headers(EXT_PROC)))
    client.send(DataFrame(1, data=b"".join(grpc_message(x) for x in body)))
    routed = await client.until(lambda f: isinstance(f, DataFrame) and f.stream_id == 1, "reply")
    reply = ProcessingResponse.FromString(grpc_messages(routed.data)[0])
    assert m.set_headers(reply)["x-gateway-destination-endpoint"].startswith("127.0.0.1:")
    assert router.datastore.total_in_flight() == 1
    client.send(RstStreamFrame(1, error_code=CANCEL))
    await until(lambda: router.datastore.total_in_flight() == 0, "in-flight back to zero")
    client.send(PingFrame(0, opaque_data=b"stillok!"))  # the connection lives on
    await client.until(lambda f: isinstance(f, PingFrame) and "ACK" in f.flags, "ping ack")


async def test_stop_sends_goaway_and_lets_open_streams_finish(
    epp: tuple[NativeTransport, Router, int],
) -> None:
    transport, router, port = epp
    client = await RawClient.open(port)
    client.send(client.headers(1, request_headers(EXT_PROC)))
    client.send(DataFrame(1, data=grpc_message(m.request_headers().SerializeToString())))
    await until(lambda: transport.open_calls == 1, "stream open")
    stopping = asyncio.create_task(transport.stop(grace=120))
    goaway = await client.until(lambda f: isinstance(f, GoAwayFrame), "GOAWAY")
    assert goaway.error_code == NO_ERROR and goaway.last_stream_id == 1
    client.call(3, EXT_PROC, b"")  # after the GOAWAY: refused, never processed
    refused = await client.until(lambda f: isinstance(f, RstStreamFrame), "refusal")
    assert (refused.stream_id, refused.error_code) == (3, REFUSED_STREAM)
    assert not stopping.done()
    client.send(DataFrame(1, data=grpc_message(m.request_body(BODY, True).SerializeToString())))
    client.send(DataFrame(1, flags=["END_STREAM"]))
    headers, data = await client.response(1)
    assert headers["grpc-status"] == "0"
    assert len(grpc_messages(data)) == 2  # routed headers, the body echoed
    await client.closed()  # the connection closes once its streams are done
    await stopping
    assert router.datastore.total_in_flight() == 0


async def test_streams_past_the_concurrency_limit_are_refused(echo_port: int) -> None:
    client = await RawClient.open(echo_port)
    for stream_id in range(1, 2 * MAX_STREAMS + 2, 2):  # MAX_STREAMS + 1 open streams
        client.send(client.headers(stream_id, request_headers(ECHO)))
    last = 2 * MAX_STREAMS + 1
    refused = await client.until(lambda f: isinstance(f, RstStreamFrame), "refusal")
    assert (refused.stream_id, refused.error_code) == (last, REFUSED_STREAM)
    client.send(DataFrame(1, data=grpc_message(b"one"), flags=["END_STREAM"]))
    headers, data = await client.response(1)
    assert headers["grpc-status"] == "0" and grpc_messages(data) == [b"one"]
    client.call(last + 2, ECHO, grpc_message(b"again"))  # room again
    headers, data = await client.response(last + 2)
    assert grpc_messages(data) == [b"again"]


async def test_a_header_list_over_the_limit_is_refused_on_its_stream(echo_port: int) -> None:
    client = await H2Client.open(echo_port)
    stream_id = client.conn.get_next_available_stream_id()
    client.conn.send_headers(stream_id, request_headers(ECHO, [("x-huge", "v" * 70_000)]))
    client.flush()
    ended = await client.until(h2.events.ResponseReceived, stream_id)
    headers = dict(ended.headers)
    assert headers[b"grpc-status"] == b"8"  # RESOURCE_EXHAUSTED, trailers-only
    assert b"header list too large" in headers[b"grpc-message"]
    headers, _data = await client.call(HEALTH_CHECK, health_request("liveness"))
    assert headers[b"grpc-status"] == b"0"  # HPACK state kept in step


async def test_unknown_frame_types_are_ignored(echo_port: int) -> None:
    client = await RawClient.open(echo_port)
    # type 0xEE on the connection, 0x42 with every flag on a stream not opened yet
    client.send_bytes(b"\x00\x00\x08\xee\x00\x00\x00\x00\x00whatever")
    client.send_bytes(b"\x00\x00\x01\x42\xff\x00\x00\x00\x01x")
    client.call(1, HEALTH_CHECK, health_request("liveness"))
    headers, _ = await client.response(1)
    assert headers["grpc-status"] == "0"


async def test_frames_on_closed_streams(echo_port: int) -> None:
    client = await RawClient.open(echo_port)
    client.call(1, HEALTH_CHECK, health_request("liveness"))
    await client.response(1)
    client.send(WindowUpdateFrame(1, window_increment=10))  # in flight: ignored
    client.send(DataFrame(1, data=b"late"))
    rst = await client.until(lambda f: isinstance(f, RstStreamFrame), "RST_STREAM")
    assert (rst.stream_id, rst.error_code) == (1, STREAM_CLOSED)
    client.call(3, HEALTH_CHECK, health_request("liveness"))
    headers, _ = await client.response(3)
    assert headers["grpc-status"] == "0"
    client.send(DataFrame(9, data=b"idle"))  # a stream never opened
    frames = await client.closed()
    assert isinstance(frames[-1], GoAwayFrame) and frames[-1].error_code == PROTOCOL_ERROR


async def test_flow_control_violations(echo_port: int) -> None:
    client = await RawClient.open(echo_port)
    client.send(client.headers(1, request_headers(ECHO)))
    client.send(WindowUpdateFrame(1, window_increment=2**31 - 1))  # overflows the window
    rst = await client.until(lambda f: isinstance(f, RstStreamFrame), "RST_STREAM")
    assert (rst.stream_id, rst.error_code) == (1, FLOW_CONTROL_ERROR)
    client.send(WindowUpdateFrame(0, window_increment=0))
    frames = await client.closed()
    assert isinstance(frames[-1], GoAwayFrame) and frames[-1].error_code == PROTOCOL_ERROR


async def test_settings_and_ping_size_rules(echo_port: int) -> None:
    client = await RawClient.open(echo_port)
    client.send_bytes(b"\x00\x00\x07\x06\x00\x00\x00\x00\x00" + b"x" * 7)  # PING of 7 bytes
    frames = await client.closed()
    assert isinstance(frames[-1], GoAwayFrame) and frames[-1].error_code == FRAME_SIZE_ERROR


async def test_compressed_messages_are_refused(echo_port: int) -> None:
    client = await RawClient.open(echo_port)
    client.call(1, ECHO, grpc_message(b"zipped?", compressed=True))
    headers, _ = await client.response(1)
    assert headers["grpc-status"] == "12"


async def test_unknown_method_is_unimplemented(echo_port: int) -> None:
    client = await H2Client.open(echo_port)
    headers, data = await client.call("/no.Such/Method", grpc_message(b""))
    assert headers[b"grpc-status"] == b"12" and data == b""


def trusting(cert_pem: bytes) -> ssl.SSLContext:
    context = ssl.create_default_context(cadata=cert_pem.decode())
    context.set_alpn_protocols(["h2"])
    return context


async def test_tls_with_alpn_h2_and_a_reloaded_certificate() -> None:
    first, second = self_signed(), self_signed()
    live = LiveCertificate(first)
    transport = NativeTransport(make_router())
    port = await transport.start("127.0.0.1", 0, live)
    await transport.set_serving(True)
    try:
        before = await RawClient.open(port, tls=trusting(first.cert_pem))
        assert before.writer.get_extra_info("ssl_object").selected_alpn_protocol() == "h2"
        before.call(1, HEALTH_CHECK, health_request("liveness"))
        assert (await before.response(1))[0]["grpc-status"] == "0"
        live.replace(second)  # what the reloader does when the files change
        with pytest.raises(ssl.SSLCertVerificationError):
            await RawClient.open(port, tls=trusting(first.cert_pem))
        after = await RawClient.open(port, tls=trusting(second.cert_pem))
        after.call(1, HEALTH_CHECK, health_request("liveness"))
        assert (await after.response(1))[0]["grpc-status"] == "0"
        before.call(3, HEALTH_CHECK, health_request("liveness"))  # still served
        assert (await before.response(3))[0]["grpc-status"] == "0"
    finally:
        await transport.stop(0)
