"""What one HTTP/2 stream of the native transport is to its connection: the limits the
server advertises, the receiving end a stream's DATA goes to (:class:`Receiver`), and
the state the connection keeps per stream."""

from __future__ import annotations

from typing import Protocol

from epp.errors import InternalError

# Windows sized for Envoy: a 220 KB prompt crosses without waiting for a WINDOW_UPDATE,
# and many streams share the connection's window. Credit goes back to the peer as the
# application reads (Connection.consumed), so these also bound the bytes received and
# not yet read: per stream, and per connection (plus the messages credited ahead while
# their readers wait for them: limits.MAX_CREDITED_AHEAD).
STREAM_WINDOW = 4 * 1024 * 1024
CONNECTION_WINDOW = 64 * 1024 * 1024
MAX_CONCURRENT_STREAMS = 1024
# Largest frame accepted (advertised): a long prompt in fewer, larger DATA frames.
MAX_FRAME = 1024 * 1024
MAX_HEADER_LIST = 64 * 1024  # advertised; a longer list is refused on its stream
# A header block longer than this (before decoding) ends the connection: past the
# advertised limit, HPACK still has to be decoded to keep the tables in step.
MAX_HEADER_BLOCK = 1024 * 1024
Headers = list[tuple[str, str]]


class Receiver(Protocol):
    """The other end of one stream's request half."""

    def on_data(self, data: memoryview) -> None:
        """Bytes of the request body, in order (padding removed). The receiver hands
        their flow-control credit back with ``Connection.consumed`` (or
        ``credit_ahead``) as the application reads them; what is left unread when the
        stream ends is credited by the connection. Raises StreamError."""
        ...

    def on_end(self) -> None:
        """The peer half-closed the stream (END_STREAM)."""
        ...

    def on_reset(self) -> None:
        """The stream was reset (RST_STREAM from the peer, or the connection ended)."""
        ...


class StreamGone(InternalError):
    """The stream was reset or its connection closed: nothing more can be sent on it."""


class Stream:
    __slots__ = (
        "ahead",
        "answered",
        "credit",
        "id",
        "local_closed",
        "receiver",
        "recv_window",
        "remote_closed",
        "send_window",
        "unread",
    )

    def __init__(self, stream_id: int, send_window: int) -> None:
        self.id = stream_id
        self.receiver: Receiver | None = None
        self.send_window = send_window
        self.recv_window = STREAM_WINDOW  # what the peer may still send
        self.credit = 0  # read since the last WINDOW_UPDATE, not yet given back
        self.unread = 0  # given to the receiver, not yet read nor credited
        self.ahead = 0  # credited before the application read it (a message in assembly)
        self.remote_closed = False
        self.local_closed = False
        self.answered = False  # response headers sent


class Refused:
    """A stream answered at once (its header list too large): its body is dropped."""

    def on_data(self, data: memoryview) -> None:
        pass

    def on_end(self) -> None:
        pass

    def on_reset(self) -> None:
        pass


# grpc-status 8, RESOURCE_EXHAUSTED, as a trailers-only response
TOO_LARGE: Headers = [
    (":status", "200"),
    ("content-type", "application/grpc"),
    ("grpc-status", "8"),
    ("grpc-message", "request header list too large"),
]
