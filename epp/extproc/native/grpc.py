"""gRPC over the HTTP/2 connection: each request stream's :path picks a method, whose
handler runs as one task over a :class:`Call` (``recv`` / ``send`` of protobuf
messages); the length-prefixed messages are cut straight out of DATA payloads and parsed
once, and the handler's outcome becomes the ``grpc-status`` trailers.

``grpc-timeout`` is not honoured: Envoy's ext_proc streams carry none (its own
``message_timeout`` bounds each reply), and a stream ends when the peer resets it.
Compressed messages are refused (UNIMPLEMENTED): the server advertises no encoding.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar
from urllib.parse import quote

from epp.errors import InternalError
from epp.extproc.native import frames
from epp.extproc.native.connection import Connection
from epp.extproc.native.frames import ErrorCode, StreamError
from epp.extproc.native.streams import Headers, StreamGone

log = logging.getLogger("epp.extproc.native")

# gRPC status codes used here
OK = 0
CANCELLED = 1
UNKNOWN = 2
INVALID_ARGUMENT = 3
NOT_FOUND = 5
RESOURCE_EXHAUSTED = 8
FAILED_PRECONDITION = 9
UNIMPLEMENTED = 12
INTERNAL = 13
UNAVAILABLE = 14

_PREFIX = 5  # compressed flag + 4-byte length


class Message(Protocol):
    def SerializeToString(self) -> bytes: ...


M = TypeVar("M")


class GrpcError(InternalError):
    """Ends a call with this status (raised by a handler or by the framing)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class Call(Generic[M]):
    """One gRPC call: its request messages in, its replies out. ``recv`` returns None
    once the client half-closed; a reset cancels the handler's task.

    Flow-control credit goes back as ``recv`` hands each message over. While the handler
    has no message waiting, the bytes of the one being assembled are credited as they
    come (``Connection.credit_ahead``): it cannot read it before it is whole, and one
    longer than the stream window would otherwise never be."""

    def __init__(
        self, conn: Connection, stream_id: int, parse: Callable[[Any], M], headers: Headers
    ) -> None:
        self.metadata = headers
        self._conn = conn
        self._id = stream_id
        self._parse = parse
        self._buf = bytearray()  # the start of a message still arriving
        self._ahead = 0  # bytes of it credited ahead
        # parsed messages, each with (bytes to credit, bytes credited ahead) for its read
        self._messages: deque[tuple[M, int, int]] = deque()
        self._ended = False
        self._error: GrpcError | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._headers_sent = False
        self._finished = False
        self.task: asyncio.Task[None] | None = None
        self.max_message = 0  # set by the server

    # -- Receiver (called by the connection) -------------------------------------------

    def on_data(self, data: memoryview) -> None:
        # Once failed, the stream is gone from its connection, which credits what
        # arrives; otherwise each message's bytes are credited when it is read.
        if self._error is not None:
            return
        if not self._buf and len(data) >= _PREFIX:  # whole messages straight from the frame
            at = 0
            while len(data) - at >= _PREFIX:
                size = frames.u32(data, at + 1)
                if len(data) - at - _PREFIX < size:
                    break
                self._message(data[at], data[at + _PREFIX : at + _PREFIX + size], 0)
                at += _PREFIX + size
            if at < len(data):
                self._buf += data[at:]
        else:
            self._buf += data
            buf = self._buf
            at = 0
            while len(buf) - at >= _PREFIX:
                size = frames.u32(buf, at + 1)
                if len(buf) - at - _PREFIX < size:
                    break
                with memoryview(buf) as view:  # the first one may have been credited ahead
                    self._message(buf[at], view[at + _PREFIX : at + _PREFIX + size], self._ahead)
                self._ahead = 0
                at += _PREFIX + size
            if at:
                self._buf = buf[at:]
        if self._buf:
            if len(self._buf) >= _PREFIX and frames.u32(self._buf, 1) > self.max_message:
                self._fail(GrpcError(RESOURCE_EXHAUSTED, "message larger than the server accepts"))
            self._credit_ahead()
        self._wake()

    def _message(self, flag: int, body: memoryview, ahead: int) -> None:
        if self._error is not None:
            return
        if flag:
            self._fail(GrpcError(UNIMPLEMENTED, "compressed messages are not accepted"))
            return
        if len(body) > self.max_message:
            self._fail(GrpcError(RESOURCE_EXHAUSTED, "message larger than the server accepts"))
            return
        try:
            message = self._parse(body)
        except Exception:  # protobuf's DecodeError, whatever the backend
            self._fail(GrpcError(INTERNAL, "request message could not be parsed"))
            return
        self._messages.append((message, _PREFIX + len(body) - ahead, ahead))

    def _credit_ahead(self) -> None:
        """With no message waiting for the handler, credit the one being assembled."""
        more = len(self._buf) - self._ahead
        if more <= 0 or self._messages or self._error is not None:
            return
        if self._conn.credit_ahead(self._id, more):
            self._ahead += more
        else:
            self._fail(GrpcError(RESOURCE_EXHAUSTED, "too many large messages in progress"))

    def _fail(self, error: GrpcError) -> None:
        """Answer ``error`` now; the handler (which may not have started) is cancelled."""
        self._error = error
        self._buf = bytearray()
        self._ahead = 0
        self._messages.clear()  # what they held goes back with the stream
        self.finish(error.status, error.message)
        if self.task is not None:
            self.task.cancel()

    def on_end(self) -> None:
        self._ended = True
        if self._buf and self._error is None:
            self._fail(GrpcError(INTERNAL, "request ended inside a message"))
        self._wake()

    def on_reset(self) -> None:
        self._ended = True
        if self.task is not None:
            self.task.cancel()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done() and (self._messages or self._ended):
            waiter.set_result(None)

    # -- the handler's side ------------------------------------------------------------

    async def recv(self) -> M | None:
        while not self._messages:
            if self._ended:
                return None
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        message, credit, ahead = self._messages.popleft()
        self._conn.consumed(self._id, credit, ahead)
        if self._buf and not self._messages:
            self._credit_ahead()
        return message

    def send(self, message: Message) -> Awaitable[None]:
        """Send one message; await what this returns. A message that fits the peer's
        windows and frame size is queued at once (a done future comes back: no
        coroutine); a longer one, or one the windows hold back, is sent by a coroutine
        that waits for room."""
        body = message.SerializeToString()
        if not self._headers_sent:
            self._headers_sent = True
            self._conn.send_headers(self._id, _RESPONSE_HEADERS, end_stream=False)
        prefix = len(body).to_bytes(_PREFIX, "big")
        sent = self._conn.send_message(self._id, prefix, body)
        return sent if sent is not None else self._conn.send_data(self._id, prefix + body)

    def finish(self, status: int, message: str = "") -> None:
        """Trailers (or a trailers-only response) with ``status``, once; nothing if the
        stream is already gone."""
        if self._finished:
            return
        self._finished = True
        trailers = [("grpc-status", str(status))]
        if message:
            trailers.append(("grpc-message", quote(message, safe=" !#$&'()*+,/:;=?@[]~")))
        if not self._headers_sent:
            trailers = _RESPONSE_HEADERS + trailers
        with contextlib.suppress(StreamGone):
            self._conn.send_headers(self._id, trailers, end_stream=True)


_RESPONSE_HEADERS: Headers = [(":status", "200"), ("content-type", "application/grpc")]

Handler = Callable[[Call[Any]], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Method:
    parse: Callable[[Any], Any]  # the request class's FromString
    handler: Handler


class GrpcServer:
    """Routes each new stream to its method by :path; runs the handlers as tasks."""

    def __init__(self, methods: dict[str, Method], max_message: int) -> None:
        self._methods = methods
        self._max_message = max_message
        self.calls: set[Call[Any]] = set()

    def open_stream(self, conn: Connection, stream_id: int, headers: Headers) -> Call[Any]:
        path = method = content_type = ""
        regular = False
        for name, value in headers:
            if name.startswith(":"):
                if regular:
                    raise StreamError(stream_id, ErrorCode.PROTOCOL_ERROR, "pseudo-header late")
                if name == ":path":
                    path = value
                elif name == ":method":
                    method = value
                elif name not in (":scheme", ":authority"):
                    raise StreamError(stream_id, ErrorCode.PROTOCOL_ERROR, f"{name} in a request")
            else:
                regular = True
                if name != name.lower() or name in _CONNECTION_HEADERS:
                    raise StreamError(stream_id, ErrorCode.PROTOCOL_ERROR, f"header {name!r}")
                if name == "content-type":
                    content_type = value
        if not path or not method:
            raise StreamError(stream_id, ErrorCode.PROTOCOL_ERROR, ":path or :method missing")
        target = self._methods.get(path)
        call: Call[Any] = Call(conn, stream_id, target.parse if target else _none, headers)
        call.max_message = self._max_message
        if method != "POST" or not content_type.startswith("application/grpc"):
            call.finish(UNIMPLEMENTED, f"{method} {content_type or 'no content-type'}: not gRPC")
        elif target is None:
            call.finish(UNIMPLEMENTED, f"unknown method {path}")
        else:
            call.task = asyncio.get_running_loop().create_task(self._run(call, target.handler))
        return call

    async def _run(self, call: Call[Any], handler: Handler) -> None:
        self.calls.add(call)
        status, message = OK, ""
        try:
            await handler(call)
        except GrpcError as exc:
            status, message = exc.status, exc.message
        except asyncio.CancelledError:  # reset by the peer, a framing error, or shutdown
            status, message = CANCELLED, "cancelled"
        except StreamGone:
            pass
        except Exception:
            log.exception("gRPC handler failed")
            status, message = INTERNAL, "internal error"
        finally:
            self.calls.discard(call)
        call.finish(status, message)


def _none(_: object) -> None:
    return None


# connection-specific fields are malformed in HTTP/2 (RFC 9113 §8.2.2)
_CONNECTION_HEADERS = frozenset(
    {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade"}
)
