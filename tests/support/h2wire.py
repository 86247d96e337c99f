"""Raw HTTP/2 on loopback for the native transport's tests: frames are built and read
with hyperframe and header blocks with a client-side hpack coder, never with the code
under test, so that both sides of each check are independent."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Callable, Iterable

from hpack import Decoder, Encoder
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    Frame,
    GoAwayFrame,
    HeadersFrame,
    RstStreamFrame,
    SettingsFrame,
    WindowUpdateFrame,
)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
HEALTH_CHECK = "/grpc.health.v1.Health/Check"
EXT_PROC = "/envoy.service.ext_proc.v3.ExternalProcessor/Process"


def grpc_message(payload: bytes, compressed: bool = False) -> bytes:
    return bytes([compressed]) + len(payload).to_bytes(4, "big") + payload


def health_request(service: str) -> bytes:
    name = service.encode()
    return grpc_message(b"\x0a" + bytes([len(name)]) + name if name else b"")


def request_headers(path: str, extra: Iterable[tuple[str, str]] = ()) -> list[tuple[str, str]]:
    return [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", "epp"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
        *extra,
    ]


class RawClient:
    """One client connection: the preface and an empty SETTINGS are sent on open."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.encoder = Encoder()
        self.decoder = Decoder()

    @classmethod
    async def open(
        cls, port: int, preface: bool = True, tls: ssl.SSLContext | None = None
    ) -> RawClient:
        host = "127.0.0.1"
        reader, writer = await asyncio.open_connection(
            host, port, ssl=tls, server_hostname=host if tls else None
        )
        client = cls(reader, writer)
        if preface:
            client.send_bytes(PREFACE + SettingsFrame(0).serialize())
        return client

    def send(self, *frames: Frame) -> None:
        self.writer.write(b"".join(f.serialize() for f in frames))

    def send_bytes(self, data: bytes) -> None:
        self.writer.write(data)

    def block(self, headers: list[tuple[str, str]]) -> bytes:
        block: bytes = self.encoder.encode(headers)
        return block

    def headers(self, stream_id: int, headers: list[tuple[str, str]], end: bool = False) -> Frame:
        frame = HeadersFrame(stream_id, data=self.block(headers), flags=["END_HEADERS"])
        if end:
            frame.flags.add("END_STREAM")
        return frame

    def call(self, stream_id: int, path: str, body: bytes, end: bool = True) -> None:
        """Open a stream on ``path`` and send ``body`` (ending the request if ``end``)."""
        flags = ["END_STREAM"] if end else []
        self.send(
            self.headers(stream_id, request_headers(path)),
            DataFrame(stream_id, data=body, flags=flags),
        )

    async def frame(self) -> Frame | None:
        """The next frame from the server; None at EOF (or a reset connection)."""
        try:
            head = await self.reader.readexactly(9)
            frame, length = Frame.parse_frame_header(memoryview(head))
            body = await self.reader.readexactly(length)
        except (asyncio.IncompleteReadError, ConnectionError):  # a reset, a broken pipe
            return None
        frame.parse_body(memoryview(body))
        return frame

    async def until(self, wanted: Callable[[Frame], bool], what: str) -> Frame:
        while True:
            frame = await self.frame()
            assert frame is not None, f"connection closed before {what}"
            if wanted(frame):
                return frame

    async def response(self, stream_id: int) -> tuple[dict[str, str], bytes]:
        """Headers + trailers (merged) and the DATA of ``stream_id`` until END_STREAM;
        WINDOW_UPDATEs are sent back for the DATA read."""
        headers: dict[str, str] = {}
        data = bytearray()
        while True:
            frame = await self.frame()
            assert frame is not None, f"connection closed before stream {stream_id} ended"
            if isinstance(frame, RstStreamFrame) and frame.stream_id == stream_id:
                headers["rst"] = str(frame.error_code)
                return headers, bytes(data)
            if isinstance(frame, GoAwayFrame):
                raise AssertionError(f"GOAWAY {frame.error_code}: {frame.additional_data!r}")
            if frame.stream_id != stream_id:
                continue
            if isinstance(frame, HeadersFrame | ContinuationFrame):
                block = bytearray(frame.data)
                while "END_HEADERS" not in frame.flags:
                    frame = await self.frame()
                    assert isinstance(frame, ContinuationFrame)
                    block += frame.data
                headers.update(self.decoder.decode(bytes(block)))
            elif isinstance(frame, DataFrame):
                data += frame.data
                if frame.flow_controlled_length:
                    self.ack(stream_id, frame.flow_controlled_length)
            if "END_STREAM" in frame.flags:
                return headers, bytes(data)

    def ack(self, stream_id: int, size: int) -> None:
        self.send(WindowUpdateFrame(0, window_increment=size))
        self.send(WindowUpdateFrame(stream_id, window_increment=size))

    async def closed(self) -> list[Frame]:
        """Every frame until the server closes the connection."""
        frames = []
        while (frame := await self.frame()) is not None:
            frames.append(frame)
        return frames

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self.writer.wait_closed()


def grpc_messages(data: bytes) -> list[bytes]:
    out, at = [], 0
    while at < len(data):
        size = int.from_bytes(data[at + 1 : at + 5], "big")
        out.append(data[at + 5 : at + 5 + size])
        at += 5 + size
    return out
