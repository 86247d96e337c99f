"""One named background task that runs until it is stopped (the ejection loop, the
name re-resolution loop)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
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
