"""One HTTP/2 server connection (RFC 9113) as an asyncio Protocol: frames are read
straight out of the receive buffer, header blocks go through HPACK (the ``hpack``
library) only to open and close a stream, and everything the connection sends in one
event-loop turn leaves in one ``transport.write``.

What a stream carries is not this module's business: a new request stream's headers go
to ``open_stream``, which answers with the :class:`Receiver` of its DATA; replies come
back through :meth:`Connection.send_headers` / :meth:`send_data`.

Flow control follows the application: a WINDOW_UPDATE returns credit for DATA once the
receiver reports it read (:meth:`Connection.consumed`), so a slow reader holds the peer
back instead of buffering without bound. The flood limits and the keepalive are in
:mod:`epp.extproc.native.limits`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import cast

from hpack import Decoder, Encoder, HPACKError

from epp.extproc.native import frames, limits
from epp.extproc.native.frames import (
    ConnectionFailure,
    ErrorCode,
    Flag,
    FrameType,
    Setting,
    StreamError,
)
from epp.extproc.native.streams import (
    CONNECTION_WINDOW,
    MAX_CONCURRENT_STREAMS,
    MAX_FRAME,
    MAX_HEADER_BLOCK,
    MAX_HEADER_LIST,
    STREAM_WINDOW,
    TOO_LARGE,
    Headers,
    Receiver,
    Refused,
    Stream,
    StreamGone,
)

log = logging.getLogger("epp.extproc.native")

# (connection, stream id, request headers) -> the stream's receiver; raises StreamError
OpenStream = Callable[["Connection", int, Headers], Receiver]
_KEEPALIVE_PING = b"epp-kapi"  # the payload of our own PINGs, told apart by their acks


class _HeaderBlock:
    """A header block spread over HEADERS + CONTINUATION frames, until END_HEADERS."""

    __slots__ = ("flags", "frames", "parts", "size", "stream_id")

    def __init__(self, stream_id: int, flags: int, first: bytes) -> None:
        self.stream_id = stream_id
        self.flags = flags
        self.parts = [first]
        self.size = len(first)
        self.frames = 1


class Connection(asyncio.Protocol):
    def __init__(
        self,
        open_stream: OpenStream,
        on_close: Callable[[Connection], None],
        max_streams: int = MAX_CONCURRENT_STREAMS,
        keepalive_time: float = limits.KEEPALIVE_TIME,
        keepalive_timeout: float = limits.KEEPALIVE_TIMEOUT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._open_stream = open_stream
        self._max_streams = max_streams
        self._on_close = on_close
        self._transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self._preface_seen = False
        self._settings_seen = False
        self._out: list[bytes | memoryview] = []  # joined into one write
        self._flush_pending = False
        self._streams: dict[int, Stream] = {}
        self._last_stream = 0  # highest stream id the peer opened
        self._goaway_sent = False
        self._closed = False
        self._decoder = Decoder()
        self._decoder.max_header_list_size = MAX_HEADER_BLOCK
        self._encoder = Encoder()
        # what the peer allows us to send
        self._peer_initial_window = frames.DEFAULT_WINDOW
        self._peer_max_frame = frames.DEFAULT_MAX_FRAME
        self._send_window = frames.DEFAULT_WINDOW
        self._recv_window = CONNECTION_WINDOW  # what the peer may still send
        self._credit = 0  # read since the last WINDOW_UPDATE, not yet given back
        self._ahead = 0  # credited before being read, over all streams
        self._continuing: _HeaderBlock | None = None
        # flood limits (limits.py)
        self._backlog = 0  # control frames queued since the socket last took it all
        self._clock = clock
        self._tokens = float(limits.CONTROL_BURST)  # PINGs / SETTINGS still allowed
        self._refilled = clock()
        self._empty = 0  # empty frames in a row
        self._opened = 0  # streams opened
        self._premature = 0  # of them, reset by the peer before any answer
        # keepalive
        self._keepalive_time = keepalive_time
        self._keepalive_timeout = keepalive_timeout
        self._heard = False  # something arrived since the last keepalive check
        self._keepalive: asyncio.TimerHandle | None = None
        self._window_waiters: list[asyncio.Future[None]] = []
        self._writable: asyncio.Future[None] | None = None  # set while writing is paused
        self._sent: asyncio.Future[None] | None = None  # done: what send_message returns
        self.idle = asyncio.Event()  # no open stream
        self.idle.set()
        self.closed = asyncio.Event()

    # -- asyncio.Protocol --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, only alike
        self._transport = cast(asyncio.Transport, transport)
        self._sent = asyncio.get_running_loop().create_future()
        self._sent.set_result(None)
        self._queue(
            frames.settings(
                {
                    Setting.MAX_CONCURRENT_STREAMS: self._max_streams,
                    Setting.INITIAL_WINDOW_SIZE: STREAM_WINDOW,
                    Setting.MAX_HEADER_LIST_SIZE: MAX_HEADER_LIST,
                    Setting.MAX_FRAME_SIZE: MAX_FRAME,
                    Setting.ENABLE_PUSH: 0,
                }
            )
        )
        self._queue(frames.window_update(0, CONNECTION_WINDOW - frames.DEFAULT_WINDOW))
        self._keepalive = asyncio.get_running_loop().call_later(
            self._keepalive_time, self._keepalive_check
        )

    def data_received(self, data: bytes) -> None:
        if self._closed:
            return
        self._heard = True
        # Frames are read from ``data`` itself when nothing was left over (the common
        # case: no copy); a frame cut across reads waits in ``_buf``. What is left is
        # copied out rather than deleted in place: a view of a frame may still be alive.
        buf: bytes | bytearray = data
        if self._buf:
            self._buf += data
            buf = self._buf
        try:
            at = 0
            if not self._preface_seen:
                at = self._preface(buf)
                if not at:
                    self._buf = bytearray(buf)
                    return
            end = len(buf)
            with memoryview(buf) as view:
                while end - at >= frames.HEADER_LEN and not self._closed:
                    length, kind, flags, stream_id = frames.read_header(buf, at)
                    if length > MAX_FRAME:
                        raise ConnectionFailure(
                            ErrorCode.FRAME_SIZE_ERROR, f"frame of {length} bytes"
                        )
                    if end - at < frames.HEADER_LEN + length:
                        break
                    start = at + frames.HEADER_LEN
                    at = start + length
                    try:
                        self._frame(kind, flags, stream_id, view[start:at])
                    except StreamError as exc:
                        self._reset(exc.stream_id, exc.code, str(exc))
            if at < end:
                self._buf = bytearray(buf[at:])
            elif self._buf:
                self._buf = bytearray()
        except ConnectionFailure as exc:
            self._fail(exc.code, str(exc))

    def _preface(self, buf: bytes | bytearray) -> int:
        """How many bytes the client preface took (0: not all there yet)."""
        size = len(frames.PREFACE)
        if not frames.PREFACE.startswith(bytes(buf[:size])):
            raise ConnectionFailure(ErrorCode.PROTOCOL_ERROR, "not an HTTP/2 preface")
        if len(buf) < size:
            return 0
        self._preface_seen = True
        return size

    def eof_received(self) -> bool:
        """The peer will send nothing more (a TCP half-close): streams still waiting
        for its data are reset, the ones it completed get their answers, then the
        connection closes (a GOAWAY first)."""
        for stream in list(self._streams.values()):
            if not stream.remote_closed:
                self._forget(stream.id)
                if stream.receiver is not None:
                    stream.receiver.on_reset()
        self.drain()
        return True  # keep our half open until then

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._transport = None
        if self._keepalive is not None:
            self._keepalive.cancel()
        for stream in list(self._streams.values()):
            self._forget(stream.id)
            if stream.receiver is not None and not (stream.local_closed and stream.remote_closed):
                stream.receiver.on_reset()
        self._wake_windows()
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        self.closed.set()
        self._on_close(self)

    def pause_writing(self) -> None:
        if self._writable is None or self._writable.done():
            self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)

    # -- frames in ---------------------------------------------------------------------

    def _frame(self, kind: int, flags: int, stream_id: int, payload: memoryview) -> None:
        if self._continuing is not None and kind != FrameType.CONTINUATION:
            raise ConnectionFailure(ErrorCode.PROTOCOL_ERROR, "header block interrupted")
        if not self._settings_seen and kind != FrameType.SETTINGS:
            raise ConnectionFailure(ErrorCode.PROTOCOL_ERROR, "the preface's SETTINGS missing")
        if kind == FrameType.DATA:
            self._data(flags, stream_id, payload)
        elif kind == FrameType.HEADERS:
            self._headers(flags, stream_id, payload)
        elif kind == FrameType.CONTINUATION:
            self._continuation(flags, stream_id, payload)
        elif kind == FrameType.SETTINGS:
            self._settings(flags, stream_id, payload)
        elif kind == FrameType.WINDOW_UPDATE:
            self._window_update(stream_id, payload)
        elif kind == FrameType.PING:
            if stream_id:
                raise ConnectionFailure(ErrorCode.PROTOCOL_ERROR, "PING on a stream")
            if len(payload) != 8:
                raise ConnectionFailure(ErrorCode.FRAME_SIZE_ERROR, "PING not 8 bytes")
            if not flags & Flag.ACK:
                self._spend("PING")
                self._control(frames.ping_ack(bytes(payload)))
            elif payload == _KEEPALIVE_PING:
                self._keepalive_acked()
        elif kind == FrameType.RST_STREAM:
            self._rst_stream(stream_id, payload)
        elif kind == FrameType.PRIORITY:
            if not stream_id:
                raise ConnectionFailure(ErrorCode.PROTOCOL_ERROR, "PRIORITY on stream 0")
            if len(payload) != 5:
                raise StreamError(stream_id, ErrorCode.FRAME_SIZE_ERROR, "PRIORITY not 5 bytes")
        elif kind == FrameType.GOAWAY:
            if stream_id:
                raise ConnectionFailure(ErrorCode.PROTOCOL_ERROR, "GOAWAY on a stream")
            if len(payload) < 8:
                raise ConnectionFailure(ErrorCode.FRAME_SIZE_ERROR, "GOAWAY under 8 bytes")
            self.drain()  # the peer opens no more streams: close once these are done
        elif kind == FrameType.PUSH_PROMISE:
            raise ConnectionFailure(ErrorCode.PROTOCOL_ERROR, "PUSH_PROMISE from a client")
        # other types are extensions: ignored (§4.1, §5.5)

    def _data(self, flags: int, stream_id: int, payload: memoryview) -> None:
        if not stream_id:
            raise ConnectionFailure(ErrorCode.PROTOCOL_ERROR, "DATA on stream 0")
        size = len(payload)
        self._recv_window -= size
        if self._recv_window < 0:
            raise ConnectionFailure(ErrorCode.FLOW_CONTROL_ERROR, "connection window exceeded")
        stream = self._streams.get(stream_id)
        if stream is None or stream.remote_closed:
            self._credit_connection(size)  # nobody reads it
            if stream_id > self._last_stream:
                raise ConnectionFailure(ErrorCode.PROTOCOL_ERROR, f"DATA on idle {stream_id}")
            raise StreamError(stream_id, ErrorCode.STREAM_CLOSED, "DATA on a closed stream")
        stream.recv_window -= size
        if stream.recv_window < 0:
            self._credit_connection(size)
            raise StreamError(stream_id, ErrorCode.FLOW_CONTROL_ERROR, "stream window exceeded")
        content = payload
        if flags & Flag.PADDED:
            content = frames.strip_padding(payload, flags, stream_id)
        end = bool(flags & Flag.END_STREAM)
        if content:
            self._empty = 0
        elif not end:
            self._empty_frame()
        if size > len(content):  # padding: nothing to read
            self._credit_read(stream, size - len(content))
        assert stream.receiver is not None
        if content:
            stream.unread += len(content)
            stream.receiver.on_data(content)
        if end:
            self._remote_end(stream)

    def _headers(self, flags: int, stream_id: int, payload: memoryview) -> None:
        if not stream_id:
            raise ConnectionFailure(ErrorCode.PROTOCOL_ERROR, "HEADERS on stream 0")
        block = frames.strip_padding(payload, flags, stream_id)
        if flags & Flag.PRIORITY:
            if len(block) < 5:
                raise ConnectionFailure(ErrorCode.FRAME_SIZE_ERROR, "HEADERS priority cut short")
            if frames.u32(block) & frames.MAX_WINDOW == stream_id:
                raise StreamError(stream_id, ErrorCode.PROTOCOL_ERROR, "stream depends on itself")
            block = block[5:]
        if flags & Flag.END_HEADERS:
            self._empty = 0
            self._header_block(stream_id, flags, bytes(block))
        else:
            if block:
                self._empty = 0
            else:
                self._empty_frame()
            self._continuing = _HeaderBlock(stream_id, flags, bytes(block))

    def _continuation(self, flags: int, stream_id: int, payload: memoryview) -> None:
        pending = self._continuing
        if pending is None or pending.stream_id != stream_id:
            raise ConnectionFailure(ErrorCode.PROTOCOL_ERROR, "CONTINUATION out of place")
        if payload or flags & Flag.END_HEADERS:
            self._empty = 0
        else:
            self._empty_frame()
        pending.parts.append(bytes(payload))
        pending.size += len(payload)
        pending.frames += 1
        if pending.size > MAX_HEADER_BLOCK:
            raise ConnectionFailure(ErrorCode.ENHANCE_YOUR_CALM, "header block too long")
        if pending.frames > limits.MAX_CONTINUATIONS + 1:
            raise ConnectionFailure(ErrorCode.ENHANCE_YOUR_CALM, "header block in too many frames")
        if flags & Flag.END_HEADERS:
            self._continuing = None
            self._header_block(stream_id, pending.flags, b"".join(pending.parts))

    def _header_block(self, stream_id: int, flags: int, block: bytes) -> None:
        try:
            decoded = self._decoder.decode(block)
        except HPACKError as exc:
            raise ConnectionFailure(ErrorCode.COMPRESSION_ERROR, f"HPACK: {exc}") from None
        headers: Headers = [(str(k), str(v)) for k, v in decoded]
        end = bool(flags & Flag.END_STREAM)
        stream = self._streams.get(stream_id)
        if stream is not None:  # trailers
            if stream.remote_closed:
                raise StreamError(stream_id, ErrorCode.STREAM_CLOSED, "HEADERS after END_STREAM")
            if not end:
                raise StreamError(stream_id, ErrorCode.PROTOCOL_ERROR, "trailers not ending it")
            self._remote_end(stream)
            return
        if stream_id <= self._last_stream:
            raise ConnectionFailure(ErrorCode.STREAM_CLOSED, f"HEADERS on closed {stream_id}")
        if not stream_id % 2:
            raise ConnectionFailure(ErrorCode.PROTOCOL_ERROR, f"even stream id {stream_id}")
        self._last_stream = stream_id
        if self._goaway_sent:
            raise StreamError(stream_id, ErrorCode.REFUSED_STREAM, "shutting down")
        if len(self._streams) >= self._max_streams:
            raise StreamError(stream_id, ErrorCode.REFUSED_STREAM, "too many concurrent streams")
        stream = Stream(stream_id, self._peer_initial_window)
        self._streams[stream_id] = stream
        self._opened += 1
        self.idle.clear()
        if sum(len(k) + len(v) + 32 for k, v in headers) > MAX_HEADER_LIST:
            stream.receiver = Refused()
            self.send_headers(stream_id, TOO_LARGE, end_stream=True)
        else:
            stream.receiver = self._open_stream(self, stream_id, headers)
        if end:
            self._remote_end(stream)

    def _settings(self, flags: int, stream_id: int, payload: memoryview) -> None:
        if stream_id:
            raise ConnectionFailure(ErrorCode.PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & Flag.ACK:
            if payload:
                raise ConnectionFailure(ErrorCode.FRAME_SIZE_ERROR, "SETTINGS ack with a payload")
            return
        if len(payload) % 6:
            raise ConnectionFailure(ErrorCode.FRAME_SIZE_ERROR, "SETTINGS length not 6n")
        if self._settings_seen:  # the preface's SETTINGS is free
            self._spend("SETTINGS")
        self._settings_seen = True
        for key, value in frames.parse_settings(bytes(payload)):
            if key == Setting.HEADER_TABLE_SIZE:
                self._encoder.header_table_size = value
            elif key == Setting.ENABLE_PUSH and value > 1:
                raise ConnectionFailure(ErrorCode.PROTOCOL_ERROR, "ENABLE_PUSH not 0 or 1")
            elif key == Setting.INITIAL_WINDOW_SIZE:
                if value > frames.MAX_WINDOW:
                    raise ConnectionFailure(ErrorCode.FLOW_CONTROL_ERROR, "window over 2^31-1")
                delta = value - self._peer_initial_window
                self._peer_initial_window = value
                for stream in self._streams.values():
                    stream.send_window += delta
                    if stream.send_window > frames.MAX_WINDOW:
                        raise ConnectionFailure(ErrorCode.FLOW_CONTROL_ERROR, "window overflow")
                self._wake_windows()
            elif key == Setting.MAX_FRAME_SIZE:
                if not frames.DEFAULT_MAX_FRAME <= value <= frames.LARGEST_MAX_FRAME:
                    raise ConnectionFailure(ErrorCode.PROTOCOL_ERROR, "MAX_FRAME_SIZE out of range")
                self._peer_max_frame = value
        self._control(frames.SETTINGS_ACK)

    def _window_update(self, stream_id: int, payload: memoryview) -> None:
        if len(payload) != 4:
            raise ConnectionFailure(ErrorCode.FRAME_SIZE_ERROR, "WINDOW_UPDATE not 4 bytes")
        increment = frames.u32(payload) & frames.MAX_WINDOW
        if not stream_id:
            if not increment:
                raise ConnectionFailure(ErrorCode.PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
            self._send_window += increment
            if self._send_window > frames.MAX_WINDOW:
                raise ConnectionFailure(ErrorCode.FLOW_CONTROL_ERROR, "connection window overflow")
        else:
            stream = self._streams.get(stream_id)
            if stream is None:
                if stream_id > self._last_stream:
                    raise ConnectionFailure(ErrorCode.PROTOCOL_ERROR, "WINDOW_UPDATE, idle stream")
                return  # closed: frames in flight are fine
            if not increment:
                raise StreamError(stream_id, ErrorCode.PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
            stream.send_window += increment
            if stream.send_window > frames.MAX_WINDOW:
                raise StreamError(stream_id, ErrorCode.FLOW_CONTROL_ERROR, "window overflow")
        self._wake_windows()

    def _rst_stream(self, stream_id: int, payload: memoryview) -> None:
        if not stream_id:
            raise ConnectionFailure(ErrorCode.PROTOCOL_ERROR, "RST_STREAM on stream 0")
        if len(payload) != 4:
            raise ConnectionFailure(ErrorCode.FRAME_SIZE_ERROR, "RST_STREAM not 4 bytes")
        if stream_id > self._last_stream:
            raise ConnectionFailure(ErrorCode.PROTOCOL_ERROR, "RST_STREAM on idle stream")
        stream = self._forget(stream_id)
        if stream is None:
            return
        if not stream.answered:
            self._premature += 1
        if stream.receiver is not None:
            stream.receiver.on_reset()
        if self._premature >= limits.RAPID_RESETS and 2 * self._premature > self._opened:
            raise ConnectionFailure(ErrorCode.ENHANCE_YOUR_CALM, "streams reset before an answer")

    # -- streams -----------------------------------------------------------------------

    def _remote_end(self, stream: Stream) -> None:
        stream.remote_closed = True
        if stream.local_closed:
            self._forget(stream.id)
        assert stream.receiver is not None
        stream.receiver.on_end()

    def _forget(self, stream_id: int) -> Stream | None:
        stream = self._streams.pop(stream_id, None)
        if stream is not None:
            # what its application will not read goes back to the connection's window
            self._ahead -= stream.ahead
            self._credit_connection(stream.unread)
            stream.ahead = stream.unread = 0
            self._wake_windows()
            if not self._streams:
                self.idle.set()
                if self._goaway_sent:
                    self._close_soon()
        return stream

    def _reset(self, stream_id: int, code: ErrorCode, reason: str) -> None:
        """A stream error (ours or the peer's): RST_STREAM, and the stream is gone."""
        log.debug("HTTP/2 stream %d reset (%s): %s", stream_id, code.name, reason)
        self._control(frames.rst_stream(stream_id, code))
        stream = self._forget(stream_id)
        if stream is not None and stream.receiver is not None:
            stream.receiver.on_reset()

    def send_headers(self, stream_id: int, headers: Headers, end_stream: bool) -> None:
        """A response's headers, or its trailers with ``end_stream``; raises StreamGone."""
        stream = self._streams.get(stream_id)
        if stream is None or self._closed:
            raise StreamGone(stream_id)
        block = self._encoder.encode(headers)
        stream.answered = True
        self._queue(frames.headers(stream_id, block, self._peer_max_frame, end_stream))
        if end_stream:
            stream.local_closed = True
            if stream.remote_closed:
                self._forget(stream_id)
            else:  # the response is complete: the rest of the request is not needed (§8.1)
                self._reset(stream_id, ErrorCode.NO_ERROR, "response complete")

    def send_message(
        self, stream_id: int, prefix: bytes, body: bytes
    ) -> asyncio.Future[None] | None:
        """``prefix + body`` as one DATA frame, queued now if the peer's windows and
        largest frame take it and the socket takes writes: then a done future comes
        back. None: nothing was queued (:meth:`send_data` sends it). Raises
        StreamGone."""
        stream = self._streams.get(stream_id)
        if stream is None or self._closed:
            raise StreamGone(stream_id)
        size = len(prefix) + len(body)
        writable = self._writable is None or self._writable.done()
        if (
            size > stream.send_window
            or size > self._send_window
            or size > self._peer_max_frame
            or not writable
            or self._sent is None
            or self._window_waiters  # a message waits for room: it goes first
        ):
            return None
        stream.send_window -= size
        self._send_window -= size
        self._out += (frames.header(size, FrameType.DATA, 0, stream_id), prefix, body)
        self._flush_soon()
        return self._sent

    async def send_data(self, stream_id: int, payload: bytes) -> None:
        """``payload`` as DATA, as fast as the peer's windows allow; raises StreamGone."""
        view = memoryview(payload)
        while True:
            stream = self._streams.get(stream_id)
            if stream is None or self._closed:
                raise StreamGone(stream_id)
            room = min(len(view), stream.send_window, self._send_window)
            if room > 0 or not view:
                stream.send_window -= room
                self._send_window -= room
                self._out += frames.data(stream_id, view[:room], self._peer_max_frame)
                self._flush_soon()
                view = view[room:]
                if not view:
                    break
            waiter = asyncio.get_running_loop().create_future()
            self._window_waiters.append(waiter)
            await waiter
        if self._writable is not None and not self._writable.done():
            await asyncio.shield(self._writable)

    # -- flow control: credit as the application reads --------------------------------

    def consumed(self, stream_id: int, size: int, settled: int = 0) -> None:
        """The application read ``size`` bytes of the stream's DATA: their credit goes
        back to the peer (a WINDOW_UPDATE once half a window has gathered). ``settled``:
        bytes it has now read that :meth:`credit_ahead` credited before."""
        stream = self._streams.get(stream_id)
        if stream is None:  # gone: what it held was credited then
            return
        stream.ahead -= settled
        self._ahead -= settled
        if size:
            stream.unread -= size
            self._credit_read(stream, size)

    def credit_ahead(self, stream_id: int, size: int) -> bool:
        """Credit ``size`` unread bytes of a message the application waits for: a message
        longer than the stream window completes only so. False (nothing credited) if
        the connection's bytes credited ahead would pass MAX_CREDITED_AHEAD."""
        stream = self._streams.get(stream_id)
        if stream is None:
            return True
        if self._ahead + size > limits.MAX_CREDITED_AHEAD:
            return False
        stream.ahead += size
        self._ahead += size
        stream.unread -= size
        self._credit_read(stream, size)
        return True

    def _credit_read(self, stream: Stream, size: int) -> None:
        self._credit_connection(size)
        if stream.remote_closed:  # the peer sends no more on it
            return
        stream.credit += size
        if stream.credit >= STREAM_WINDOW // 2:
            self._control(frames.window_update(stream.id, stream.credit))
            stream.recv_window += stream.credit
            stream.credit = 0

    def _credit_connection(self, size: int) -> None:
        self._credit += size
        if self._credit >= CONNECTION_WINDOW // 2:
            self._control(frames.window_update(0, self._credit))
            self._recv_window += self._credit
            self._credit = 0

    # -- flood limits (limits.py) -------------------------------------------------------

    def _spend(self, what: str) -> None:
        """One PING or SETTINGS to answer, from the connection's token bucket."""
        now = self._clock()
        tokens = self._tokens + (now - self._refilled) * limits.CONTROL_RATE
        self._tokens = min(float(limits.CONTROL_BURST), tokens) - 1
        self._refilled = now
        if self._tokens < 0:
            raise ConnectionFailure(ErrorCode.ENHANCE_YOUR_CALM, f"{what} flood")

    def _empty_frame(self) -> None:
        self._empty += 1
        if self._empty > limits.MAX_EMPTY_FRAMES:
            raise ConnectionFailure(ErrorCode.ENHANCE_YOUR_CALM, "empty frames in a row")

    def _control(self, frame: bytes) -> None:
        """Queue a control frame; past MAX_CONTROL_BACKLOG of them while the peer does
        not read what is written, the connection ends."""
        self._backlog += 1
        if self._backlog > limits.MAX_CONTROL_BACKLOG:
            self._fail(ErrorCode.ENHANCE_YOUR_CALM, "control frames piling up unread", abort=True)
            return
        self._queue(frame)

    # -- keepalive ---------------------------------------------------------------------

    def _keepalive_check(self) -> None:
        """Every KEEPALIVE_TIME: PING a peer that sent nothing meanwhile while streams
        are open (as grpclib and grpcio do); otherwise look again later."""
        if self._closed:
            return
        loop = asyncio.get_running_loop()
        if self._heard or not self._streams:
            self._heard = False
            self._keepalive = loop.call_later(self._keepalive_time, self._keepalive_check)
            return
        self._queue(frames.ping(_KEEPALIVE_PING))
        self._keepalive = loop.call_later(self._keepalive_timeout, self._keepalive_expired)

    def _keepalive_acked(self) -> None:
        if self._keepalive is not None:
            self._keepalive.cancel()
        self._heard = False
        self._keepalive = asyncio.get_running_loop().call_later(
            self._keepalive_time, self._keepalive_check
        )

    def _keepalive_expired(self) -> None:
        self._fail(ErrorCode.NO_ERROR, "keepalive PING not answered", abort=True)

    def drain(self) -> None:
        """Accept no new stream (GOAWAY naming the last one opened) and close the
        connection once the open streams are done."""
        if self._goaway_sent or self._closed:
            return
        self._goaway_sent = True
        self._queue(frames.goaway(self._last_stream, ErrorCode.NO_ERROR))
        if not self._streams:
            self._close_soon()

    def close(self) -> None:
        """Close once what is queued is sent; open streams are reset."""
        if self._transport is not None and not self._closed:
            if not self._goaway_sent:
                self._queue(frames.goaway(self._last_stream, ErrorCode.NO_ERROR))
            self._flush()
            self._transport.close()

    def abort(self) -> None:
        """Close at once, unsent bytes dropped (a peer that stopped reading cannot hold
        a shutdown up: Python 3.12's ``Server.wait_closed`` waits for every connection)."""
        if self._transport is not None and not self._closed:
            self._transport.abort()

    def _fail(self, code: ErrorCode, reason: str, abort: bool = False) -> None:
        """GOAWAY with ``code``, then close; ``abort``: the peer is not reading, so
        what it has not taken is dropped rather than waited on."""
        if self._closed:
            return
        log.info("HTTP/2 connection closed (%s): %s", code.name, reason)
        self._goaway_sent = True
        self._out.append(frames.goaway(self._last_stream, code, reason.encode()[:256]))
        self._flush()
        self._closed = True
        if self._transport is not None:
            if abort and self._transport.get_write_buffer_size():
                self._transport.abort()
            else:
                self._transport.close()

    def _close_soon(self) -> None:
        asyncio.get_running_loop().call_soon(self.close)

    def _wake_windows(self) -> None:
        waiters, self._window_waiters = self._window_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    # -- bytes out ---------------------------------------------------------------------

    def _queue(self, data: bytes) -> None:
        self._out.append(data)
        self._flush_soon()

    def _flush_soon(self) -> None:
        if not self._flush_pending:
            self._flush_pending = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_pending = False
        transport = self._transport
        if self._out and transport is not None and not transport.is_closing():
            transport.write(b"".join(self._out))
            if not transport.get_write_buffer_size():  # the socket took it all
                self._backlog = 0
        self._out.clear()
