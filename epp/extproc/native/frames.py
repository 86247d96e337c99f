"""HTTP/2 frames (RFC 9113 §4, §6) as bytes: the 9-byte header read straight out of
the receive buffer, and each frame the server sends built as one ``bytes``. Pure: no
I/O and no frame objects, so that a DATA frame costs a header read and a slice."""

from __future__ import annotations

import struct
from enum import IntEnum

from epp.errors import InternalError

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
HEADER_LEN = 9
MAX_WINDOW = 2**31 - 1
DEFAULT_WINDOW = 65_535
DEFAULT_MAX_FRAME = 16_384
LARGEST_MAX_FRAME = 2**24 - 1


class FrameType(IntEnum):
    DATA = 0x0
    HEADERS = 0x1
    PRIORITY = 0x2
    RST_STREAM = 0x3
    SETTINGS = 0x4
    PUSH_PROMISE = 0x5
    PING = 0x6
    GOAWAY = 0x7
    WINDOW_UPDATE = 0x8
    CONTINUATION = 0x9


class Flag:
    END_STREAM = 0x1
    ACK = 0x1  # SETTINGS and PING
    END_HEADERS = 0x4
    PADDED = 0x8
    PRIORITY = 0x20


class Setting(IntEnum):
    HEADER_TABLE_SIZE = 0x1
    ENABLE_PUSH = 0x2
    MAX_CONCURRENT_STREAMS = 0x3
    INITIAL_WINDOW_SIZE = 0x4
    MAX_FRAME_SIZE = 0x5
    MAX_HEADER_LIST_SIZE = 0x6


class ErrorCode(IntEnum):
    NO_ERROR = 0x0
    PROTOCOL_ERROR = 0x1
    INTERNAL_ERROR = 0x2
    FLOW_CONTROL_ERROR = 0x3
    SETTINGS_TIMEOUT = 0x4
    STREAM_CLOSED = 0x5
    FRAME_SIZE_ERROR = 0x6
    REFUSED_STREAM = 0x7
    CANCEL = 0x8
    COMPRESSION_ERROR = 0x9
    CONNECT_ERROR = 0xA
    ENHANCE_YOUR_CALM = 0xB
    INADEQUATE_SECURITY = 0xC
    HTTP_1_1_REQUIRED = 0xD


class ConnectionFailure(InternalError):
    """The peer broke the protocol for the whole connection: GOAWAY with ``code``."""

    def __init__(self, code: ErrorCode, reason: str) -> None:
        super().__init__(reason)
        self.code = code


class StreamError(InternalError):
    """The peer broke the protocol on one stream: RST_STREAM with ``code``."""

    def __init__(self, stream_id: int, code: ErrorCode, reason: str) -> None:
        super().__init__(reason)
        self.stream_id = stream_id
        self.code = code


_HEADER = struct.Struct(">HBBBL")  # length as 16 + 8 bits (24 in all), type, flags, id
_U32 = struct.Struct(">L")
_SETTING = struct.Struct(">HL")
_GOAWAY = struct.Struct(">LL")


def read_header(buf: bytearray | bytes, at: int) -> tuple[int, int, int, int]:
    """(payload length, type, flags, stream id) of the frame whose header starts at
    ``at``; the caller has checked that 9 bytes are there."""
    high, low, kind, flags, stream_id = _HEADER.unpack_from(buf, at)
    return (high << 8) | low, kind, flags, stream_id & MAX_WINDOW


def header(length: int, kind: int, flags: int, stream_id: int) -> bytes:
    return _HEADER.pack(length >> 8, length & 0xFF, kind, flags, stream_id)


def u32(buf: bytearray | bytes | memoryview, at: int = 0) -> int:
    value: int = _U32.unpack_from(buf, at)[0]
    return value


def settings(values: dict[Setting, int]) -> bytes:
    payload = b"".join(_SETTING.pack(key, value) for key, value in values.items())
    return header(len(payload), FrameType.SETTINGS, 0, 0) + payload


SETTINGS_ACK = header(0, FrameType.SETTINGS, Flag.ACK, 0)


def parse_settings(payload: bytes) -> list[tuple[int, int]]:
    """The (identifier, value) pairs of a SETTINGS payload (its length a multiple of 6)."""
    return [_SETTING.unpack_from(payload, at) for at in range(0, len(payload), 6)]


def ping(payload: bytes) -> bytes:
    return header(8, FrameType.PING, 0, 0) + payload


def ping_ack(payload: bytes) -> bytes:
    return header(8, FrameType.PING, Flag.ACK, 0) + payload


def goaway(last_stream_id: int, code: ErrorCode, debug: bytes = b"") -> bytes:
    body = _GOAWAY.pack(last_stream_id, code) + debug
    return header(len(body), FrameType.GOAWAY, 0, 0) + body


def rst_stream(stream_id: int, code: ErrorCode) -> bytes:
    return header(4, FrameType.RST_STREAM, 0, stream_id) + _U32.pack(code)


def window_update(stream_id: int, increment: int) -> bytes:
    return header(4, FrameType.WINDOW_UPDATE, 0, stream_id) + _U32.pack(increment)


def headers(stream_id: int, block: bytes, max_frame: int, end_stream: bool) -> bytes:
    """A header block as HEADERS, then CONTINUATION frames when it is longer than the
    peer's largest frame."""
    flags = Flag.END_STREAM if end_stream else 0
    if len(block) <= max_frame:
        return header(len(block), FrameType.HEADERS, flags | Flag.END_HEADERS, stream_id) + block
    parts = [header(max_frame, FrameType.HEADERS, flags, stream_id), block[:max_frame]]
    at = max_frame
    while at < len(block):
        piece = block[at : at + max_frame]
        at += len(piece)
        last = Flag.END_HEADERS if at >= len(block) else 0
        parts += [header(len(piece), FrameType.CONTINUATION, last, stream_id), piece]
    return b"".join(parts)


def data(stream_id: int, payload: memoryview, max_frame: int) -> list[bytes | memoryview]:
    """``payload`` (a view of immutable bytes: it is not copied) as DATA frames of at
    most ``max_frame`` bytes (none end the stream: gRPC ends it with trailers)."""
    out: list[bytes | memoryview] = []
    for at in range(0, len(payload), max_frame):
        piece = payload[at : at + max_frame]
        out += [header(len(piece), FrameType.DATA, 0, stream_id), piece]
    return out


def strip_padding(payload: memoryview, flags: int, stream_id: int) -> memoryview:
    """A PADDED frame's content without its pad length byte and padding (§6.1)."""
    if not flags & Flag.PADDED:
        return payload
    if not payload:
        raise ConnectionFailure(ErrorCode.FRAME_SIZE_ERROR, "padded frame without pad length")
    pad = payload[0]
    if pad >= len(payload):
        raise ConnectionFailure(
            ErrorCode.PROTOCOL_ERROR, f"padding of {pad} bytes fills stream {stream_id}'s frame"
        )
    return payload[1 : len(payload) - pad]
