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
import logging
from collections.abc import Awaitable
from typing import Any, Protocol

from envoy.service.ext_proc.v3.external_processor_pb2 import ProcessingRequest, ProcessingResponse

from epp.errors import InternalError
from epp.extproc.stream import ExtProcStream, StreamEnd
from epp.router import Router

__all__ = ["Channel", "StreamBroken", "StreamEnd", "drive"]

log = logging.getLogger(__name__)


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


class StreamBroken(InternalError):
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
    unasked = _Unasked(channel)
    machine = ExtProcStream(router, max_destinations, asyncio.get_running_loop(), unasked.push)
    end: StreamEnd = "cancelled"  # unless it ends or fails (CancelledError is a BaseException)
    unbegun: list[Awaitable[Any]] = []  # a wait the stream ended before it began
    try:
        await _carry(channel, machine, unbegun)
        end = eof
    except Exception:
        end = "error"
        raise
    finally:
        machine.close(end)
        for wait in unbegun:
            await _abandon(wait, machine)


async def _carry(channel: Channel, machine: ExtProcStream, unbegun: list[Awaitable[Any]]) -> None:
    """Feed ``machine`` the stream's messages and do what it answers, until Envoy ends
    the stream. A wait whose replies before it could not be sent goes to ``unbegun``."""
    receive: asyncio.Future[Any] | None = None  # the next message, read ahead
    try:
        while True:
            msg = await (receive or channel.recv())
            receive = None
            if msg is None:
                return
            step = machine.on_message(msg)
            while True:
                if step.end_stream:
                    raise StreamBroken(step.end_stream)
                try:
                    for reply in step.replies:
                        await channel.send(reply)
                except BaseException:  # Envoy is gone (or this task was cancelled)
                    if step.wait is not None:
                        unbegun.append(step.wait)
                    raise
                if step.wait is None:
                    break
                # the routing answer waits: read on beside it, so a client that leaves
                # (Envoy closes the stream) cancels the wait
                if receive is None:
                    receive = asyncio.ensure_future(channel.recv())
                try:
                    value = await _unless_closed(step.wait, receive)
                except Exception as error:  # the client's answer (the machine says which)
                    step = machine.on_wait_failed(error)
                    continue
                if value is _CLOSED:
                    return
                step = machine.on_waited(value)
    finally:
        if receive is not None:
            receive.cancel()


# What _unless_closed answers when the stream ended before the wait did.
_CLOSED: Any = object()


async def _unless_closed(wait: Awaitable[Any], receive: asyncio.Future[Any]) -> Any:
    """What ``wait`` gives (or raises), while ``receive``, the stream's next message, is
    read beside it: if the stream ends first, ``wait`` is cancelled and the answer is
    ``_CLOSED``. A message that arrives meanwhile is left in ``receive`` for later."""
    task = asyncio.ensure_future(wait)
    try:
        await asyncio.wait((task, receive), return_when=asyncio.FIRST_COMPLETED)
        if task.done() or (receive.exception() is None and receive.result() is not None):
            return await task
    except BaseException:
        task.cancel()
        raise
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return _CLOSED


async def _abandon(wait: Awaitable[Any], machine: ExtProcStream) -> None:
    """A wait the stream ended before it began (Envoy went away as it was asked to
    wait), once ``machine`` is closed: begun, then cancelled, so that its own cleanup
    gives back what it holds (a place in a flow-control queue; a task cancelled before
    its first step skips its body, cleanup and all); what it gave or raised all the
    same goes to the closed machine, which lets go of it (a route given meanwhile)."""
    task = asyncio.ensure_future(wait)
    await asyncio.sleep(0)  # its first step
    if not task.done():
        task.cancel()
    await asyncio.wait((task,))
    if task.cancelled():
        return
    error = task.exception()
    if error is None:
        machine.on_waited(task.result())
    elif isinstance(error, Exception):
        machine.on_wait_failed(error)


class _Unasked:
    """Sends the replies no message asked for (a stalled response's end) beside the
    driver's loop, and keeps the task until it is done."""

    __slots__ = ("_send", "_sending")

    def __init__(self, channel: Channel) -> None:
        self._send = channel.send
        self._sending: asyncio.Future[None] | None = None

    def push(self, reply: ProcessingResponse) -> None:
        self._sending = asyncio.ensure_future(self._deliver(reply))

    async def _deliver(self, reply: ProcessingResponse) -> None:
        try:
            await self._send(reply)
        except Exception as exc:  # the stream ended meanwhile: nobody left to tell
            log.debug("a reply no message asked for was not sent: %r", exc)
