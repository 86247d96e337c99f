"""One end of a parent-worker connection, behind a small Protocol (tests may use any
pair of byte streams); :class:`StreamChannel` frames :mod:`epp.workers.wire` messages
over an asyncio stream (a unix socket)."""

from __future__ import annotations

import asyncio
from typing import Protocol

import msgspec

from epp.workers import wire


class Channel(Protocol):
    def send(self, message: wire.Message) -> None:
        """Queue one message (never blocks; a closed channel drops it)."""
        ...

    def send_frame(self, frame: bytes) -> None:
        """Queue one message already encoded (:func:`wire.encode`): a broadcast encodes
        once for every channel."""
        ...

    async def receive(self) -> wire.Message | None:
        """The next message, or None once the other end has gone."""
        ...

    def close(self) -> None: ...


class StreamChannel:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    def send(self, message: wire.Message) -> None:
        self.send_frame(wire.encode(message))

    def send_frame(self, frame: bytes) -> None:
        if not self._writer.is_closing():
            self._writer.write(frame)

    async def receive(self) -> wire.Message | None:
        try:
            head = await self._reader.readexactly(wire.HEADER.size)
            (size,) = wire.HEADER.unpack(head)
            if size > wire.MAX_FRAME_BYTES:
                raise ValueError(f"a {size}-byte frame is over {wire.MAX_FRAME_BYTES}")
            return wire.decode(await self._reader.readexactly(size))
        except (asyncio.IncompleteReadError, ConnectionError):
            return None
        except (msgspec.DecodeError, ValueError):
            self.close()  # the stream is out of step: nothing after this can be read
            return None

    def close(self) -> None:
        self._writer.close()
