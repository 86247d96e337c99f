"""A streamed response whose model server stops sending mid-stream (frozen, wedged, its
network gone): the between-chunk watchdog, and the event that tells the client.

Before a stream's first byte a long silence is normal (queueing, a long prefill) and
Envoy's per-attempt idle timeout bounds it; after it, tokens come every few tens of
milliseconds, so a gap of seconds means a stuck server. Where the response body passes
the EPP (``FULL_DUPLEX_STREAMED``), the EPP ends such a stream itself, with an SSE
``error`` event, long before Envoy's timeout would cut it (docs/timeouts.md).

The watch is on the response path, the hottest code there is, so a chunk costs one
clock read: one loop timer per stream, which when it fires re-arms itself for the
newest chunk's deadline instead of being moved at every chunk.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

import orjson
from envoy.service.ext_proc.v3.external_processor_pb2 import ProcessingResponse

from epp.extproc.messages import response_body_echo

log = logging.getLogger(__name__)

# epp serve --stream-chunk-timeout's default: tokens come every few tens of milliseconds,
# a busy engine's step (a long prefill batched beside) takes seconds at most
CHUNK_TIMEOUT_S = 15.0
# the ``code`` of the error event (docs/timeouts.md, "What the client sees")
STALL_CODE = "stream_stalled"
_SSE_END = b"\n\n"
_ANTHROPIC_PATH = "/v1/messages"


class Handle(Protocol):
    def cancel(self) -> None: ...


class Timers(Protocol):
    """A clock and timers on it: an asyncio event loop, or a fake one in tests."""

    def time(self) -> float: ...

    def call_at(self, when: float, callback: Callable[[], object], /) -> Handle: ...


class ChunkWatch:
    """Calls ``on_stall`` once when no chunk came for ``timeout_s`` (counted from the
    watch's start, then from each :meth:`chunk`), unless stopped first."""

    __slots__ = ("_handle", "_on_stall", "_time", "_timeout_s", "_timers", "last")

    def __init__(self, timers: Timers, timeout_s: float, on_stall: Callable[[], None]) -> None:
        self._timers = timers
        self._time = timers.time
        self._timeout_s = timeout_s
        self._on_stall = on_stall
        self.last = timers.time()
        self._handle: Handle | None = timers.call_at(self.last + timeout_s, self._check)

    def chunk(self) -> None:
        """A chunk passed: the per-chunk cost of the watch."""
        self.last = self._time()

    def stop(self) -> None:
        handle, self._handle = self._handle, None
        if handle is not None:
            handle.cancel()

    def _check(self) -> None:
        due = self.last + self._timeout_s
        if self._timers.time() < due:  # a chunk came meanwhile: wait for its deadline
            self._handle = self._timers.call_at(due, self._check)
            return
        self._handle = None
        self._on_stall()


def stall_event(timeout_s: float, tail: bytes, anthropic: bool = False) -> bytes:
    """The SSE ``error`` event that ends a stalled stream: the OpenAI error object
    (``{"error": {"message", "type", "code"}}``), or Anthropic's
    (``{"type": "error", "error": {"type", "message"}}``) on its Messages API. ``tail``
    (the stream's last bytes) tells whether the last event was complete; if not, a
    blank line ends it first, so the error is an event of its own."""
    message = f"the model server sent nothing for {timeout_s:g} s; the stream was ended"
    if anthropic:
        error = {"type": "error", "error": {"type": "timeout_error", "message": message}}
    else:
        error = {"error": {"message": message, "type": "timeout", "code": STALL_CODE}}
    start = b"" if not tail or tail.endswith(_SSE_END) else _SSE_END
    return start + b"event: error\ndata: " + orjson.dumps(error) + _SSE_END


def stall_reply(timeout_s: float, tail: bytes, path: str, request_id: str) -> ProcessingResponse:
    """The reply that ends a stalled stream: its error event as the response's last
    chunk (FULL_DUPLEX_STREAMED), for the driver to send beside its message loop."""
    log.warning("request %s: no chunk for %g s, stream ended", request_id, timeout_s)
    event = stall_event(timeout_s, tail, anthropic=path.startswith(_ANTHROPIC_PATH))
    return response_body_echo(event, True)
