"""One background task per endpoint, following the datastore's membership.

Scrapers and ORCA streams both need "a loop per endpoint that starts when the endpoint
joins and stops when it leaves"; this is that mechanism, once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from epp.datastore import Datastore
from epp.types import Endpoint

log = logging.getLogger(__name__)

TaskFactory = Callable[[Endpoint], Coroutine[Any, Any, None]]


class EndpointTasks:
    """Runs ``factory(endpoint)`` for every endpoint in the datastore.

    A task is (re)started when an endpoint appears or changes (e.g. new engine), and
    cancelled when it leaves. A task that raises is logged and restarted on the next
    membership change only: factories are expected to loop and handle their own errors.
    """

    def __init__(self, name: str, datastore: Datastore, factory: TaskFactory) -> None:
        self._name = name
        self._datastore = datastore
        self._factory = factory
        self._tasks: dict[str, tuple[Endpoint, asyncio.Task[None]]] = {}
        self._running = False
        self._listening = False

    def start(self) -> None:
        """Start tasks for the current endpoints and follow membership from now on.
        Must be called from the event loop."""
        if self._running:
            return
        self._running = True
        if not self._listening:
            self._datastore.on_change(self._sync)
            self._listening = True
        self._sync()

    async def stop(self) -> None:
        self._running = False
        tasks = [task for _, task in self._tasks.values()]
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        # gather, not per-task suppress: a cancel aimed at stop() itself must propagate
        await asyncio.gather(*tasks, return_exceptions=True)

    def count(self) -> int:
        """How many tasks run (one per endpoint)."""
        return len(self._tasks)

    def addresses(self) -> list[str]:
        """Endpoints that currently have a task (for tests and /status)."""
        return sorted(self._tasks)

    def _sync(self) -> None:
        if not self._running:
            return
        wanted = {s.address: s.endpoint for s in self._datastore.snapshot().endpoints}
        for address, (endpoint, task) in list(self._tasks.items()):
            if wanted.get(address) != endpoint:
                task.cancel()
                del self._tasks[address]
        for address, endpoint in wanted.items():
            if address not in self._tasks:
                task = asyncio.get_running_loop().create_task(
                    self._factory(endpoint), name=f"{self._name}:{address}"
                )
                task.add_done_callback(self._done)
                self._tasks[address] = (endpoint, task)

    def _done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("%s ended with an error", task.get_name(), exc_info=task.exception())
