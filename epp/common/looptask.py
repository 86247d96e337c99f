"""One named background task that runs until it is stopped (the ejection loop, the
name re-resolution loop); :func:`every` makes one that runs a step at an interval."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any


class LoopTask:
    def __init__(self, name: str, run: Callable[[], Coroutine[Any, Any, None]]) -> None:
        self._name = name
        self._run = run
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start the task (inside the running loop); a second call is a no-op."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name=self._name)

    async def stop(self) -> None:
        """Cancel the task and wait until it has ended."""
        if self._task is not None:
            task, self._task = self._task, None
            task.cancel()
            # gather, not await: a cancel of stop() itself must not be swallowed
            await asyncio.gather(task, return_exceptions=True)


def every(
    name: str, interval_s: float, step: Callable[[], Awaitable[object]], log: logging.Logger
) -> LoopTask:
    """A task that awaits ``step()`` every ``interval_s`` seconds; a step that raises is
    logged (``log``, naming ``name``) and the next one runs on time."""

    async def run() -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                await step()
            except Exception:  # the loop must outlive one bad pass
                log.exception("%s failed; trying again next time", name)

    return LoopTask(name, run)
