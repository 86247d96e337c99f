"""An asyncio event loop on a virtual clock, for simulations that must not sleep.

``loop.time()`` is a number the loop owns. Whenever every coroutine waits for a timer,
the loop jumps its clock to the earliest timer instead of blocking, so ``asyncio.sleep``
and ``call_later`` cost no wall time and a run is deterministic (no I/O, no threads:
callbacks run in the order of their times, ties in the order they were scheduled).
Real I/O does not work on it: its selector never reports a ready file descriptor.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

START = 1000.0  # the clock's first reading (nothing special about 0 then)


class Deadlock(RuntimeError):
    """Every coroutine waits, and for no timer: nothing can ever happen again."""


class _VirtualSelector(selectors.SelectSelector):
    """Registers like a real selector but never waits: ``select(timeout)`` moves the
    virtual clock forward by ``timeout`` and reports nothing ready."""

    def __init__(self) -> None:
        super().__init__()
        self.now = START

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:
            raise Deadlock("every task waits and no timer is due")
        if timeout > 0:
            self.now += timeout
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """A selector event loop whose ``time()`` is virtual (see the module docstring)."""

    def __init__(self) -> None:
        self._virtual = _VirtualSelector()
        super().__init__(self._virtual)

    def time(self) -> float:
        return self._virtual.now


def run_virtual(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion on a fresh :class:`VirtualTimeLoop`."""
    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        return runner.run(coro)
