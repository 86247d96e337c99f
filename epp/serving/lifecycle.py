"""Running a built :class:`App`: start its components in order, serve until SIGINT or
SIGTERM, stop them in reverse order. The only place that touches signals and the
garbage collector's settings."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from epp.common.readyfile import write_ready

log = logging.getLogger(__name__)


class Component(Protocol):
    async def start(self) -> None:
        """Begin (open ports, start tasks); raise OSError if it cannot."""
        ...

    async def stop(self) -> None:
        """End what start began; called only after start returned."""
        ...


@dataclass(frozen=True)
class Step:
    """A component made of two functions, either of them sync or async (or absent)."""

    name: str
    on_start: Callable[[], Awaitable[None] | None] | None = None
    on_stop: Callable[[], Awaitable[None] | None] | None = None

    async def start(self) -> None:
        await _call(self.on_start)

    async def stop(self) -> None:
        await _call(self.on_stop)


async def _call(fn: Callable[[], Awaitable[None] | None] | None) -> None:
    result = fn() if fn is not None else None
    if result is not None:
        await result


@dataclass(frozen=True)
class App:
    """Everything ``epp serve`` runs, built and not started yet."""

    components: Sequence[Component]  # in start order
    ready_file: Path | None = None
    # what the ready file says, asked once every component has started
    ready_info: Callable[[], dict[str, Any]] = dict


async def run(app: App) -> None:
    """Start every component in order; once all have, freeze the start-up objects out of
    the GC and write the ready file; on SIGINT or SIGTERM (or an error) stop the
    started ones in reverse order."""
    started: list[Component] = []
    try:
        for component in app.components:
            await component.start()
            started.append(component)
        # Start-up made ~60,000 long-lived objects (modules, protos, config); keep them
        # out of every later full GC pass, which otherwise walks them all each time.
        gc.collect()
        gc.freeze()
        write_ready(app.ready_file, app.ready_info())
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        log.info("shutting down")
    finally:
        for component in reversed(started):
            await component.stop()
