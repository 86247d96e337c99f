"""Poll a condition until it holds (tests wait on state, never on fixed sleeps).

``wait_for`` blocks (for tests driving servers in other processes); ``until`` awaits
between polls, for tests whose code under test runs on the same event loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

T = TypeVar("T")


def _polls(timeout: float, what: str, last: list[object]) -> Iterator[float]:
    """Delays between polls (5 ms doubling to 100 ms) until ``timeout``, then fail."""
    deadline = time.monotonic() + timeout
    delay = 0.005
    while time.monotonic() <= deadline:
        yield delay
        delay = min(delay * 2, 0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last[0]!r})")


def wait_for(check: Callable[[], T], timeout: float = 10.0, what: str = "condition") -> T:
    last: list[object] = [None]
    for delay in _polls(timeout, what, last):
        value = check()
        if value:
            return value
        last[0] = value
        time.sleep(delay)
    raise AssertionError("unreachable")


async def until(check: Callable[[], T], what: str = "condition", within: float = 10.0) -> T:
    last: list[object] = [None]
    for delay in _polls(within, what, last):
        value = check()
        if value:
            return value
        last[0] = value
        await asyncio.sleep(delay)
    raise AssertionError("unreachable")
