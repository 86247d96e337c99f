"""The one loop that carries an ext_proc stream: every transport hands :func:`drive` a
:class:`Channel` (receive Envoy's next message, send a reply) and the driver does the
rest: feeds each message to the stream's machine (:mod:`epp.extproc.stream`), sends
what it answers, performs the waits it asks for while it keeps reading the stream (a
client that leaves cancels them), sends the replies nobody asked for (a stalled
response's end), and closes the machine with how the stream ended.

A transport only maps :class:`StreamBroken` to gRPC ``FAILED_PRECONDITION``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import Any, Protocol

from envoy.service.ext_proc.v3.external_processor_pb2 import ProcessingRequest, ProcessingResponse

from epp.extproc.stream import Deferred, EndStream, ExtProcStream, StreamEnd
from epp.router import Router

__all__ = ["Channel", "StreamBroken", "StreamEnd", "drive"]


class Channel(Protocol):
    """One ext_proc stream as a transport carries it."""

    def recv(self) -> Awaitable[ProcessingRequest | None]:
        """Envoy's next message; None once Envoy half-closed the stream (a transport
        that cannot tell a half-close from a reset answers None for both). Raises if
        the stream failed."""
        ...

    def send(self, reply: ProcessingResponse) -> Awaitable[None]:
        """Send one reply. May be called while a :meth:`recv` is pending (a wait, a
        stalled response's end)."""
        ...


class StreamBroken(Exception):
    """A message broke the protocol once the response had started: the transport ends
    the gRPC stream with FAILED_PRECONDITION and ``reason`` (Envoy's failure mode
    decides the rest). The machine is closed already (as ``error``)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


async def drive(
    channel: Channel,
    router: Router,
    max_destinations: int = 1,
    eof: StreamEnd = "complete",
) -> None:
    """Carry one ext_proc stream until Envoy ends it. ``max_destinations``: how many
    ``ip:port`` the Envoy config behind the stream can use (transport.py's
    ``max_destinations``); ``eof``: how a None from ``channel.recv()`` counts
    (``complete``, or ``ended`` where the transport cannot tell a half-close from a
    reset). A cancellation counts as ``cancelled``, an exception as ``error``; either
    propagates. Raises :class:`StreamBroken` for a message that broke the protocol."""
    machine = ExtProcStream(router, max_destinations, send=channel.send)
    end: StreamEnd = "cancelled"  # unless the loop ends or fails (CancelledError is a
    receive: asyncio.Future[Any] | None = None  # BaseException): the next message, read ahead
    try:
        while True:
            msg = await (receive or channel.recv())
            receive = None
            if msg is None:
                break
            replies = machine.on_message(msg)
            if isinstance(replies, EndStream):  # the message broke the protocol
                raise StreamBroken(replies.reason)
            if isinstance(replies, Deferred):  # held (flow control, a prefill leg)
                for reply in replies.now:
                    await channel.send(reply)
                receive = asyncio.ensure_future(channel.recv())
                answer = await _unless_closed(replies.later, receive)
                if answer is None:  # Envoy closed the stream meanwhile
                    break
                replies = answer
            if not isinstance(replies, list):  # routing waits (EDS)
                replies = await replies
            for reply in replies:
                await channel.send(reply)
        end = eof
    except Exception:
        end = "error"
        raise
    finally:
        if receive is not None:
            receive.cancel()
        machine.close(end)


async def _unless_closed(
    later: Awaitable[list[ProcessingResponse]], receive: asyncio.Future[Any]
) -> list[ProcessingResponse] | None:
    """Await ``later`` while ``receive``, the stream's next message, is read beside it:
    if the stream ends first (Envoy closed it: the client left), ``later`` is cancelled
    and the answer is None. A message that arrives meanwhile is left in ``receive``."""
    task = asyncio.ensure_future(later)
    try:
        await asyncio.wait({task, receive}, return_when=asyncio.FIRST_COMPLETED)
        if task.done() or (receive.exception() is None and receive.result() is not None):
            return await task
    except BaseException:
        task.cancel()
        raise
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return None
