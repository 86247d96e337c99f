"""Poll a condition until it holds (tests wait on state, never on fixed sleeps)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(check: Callable[[], T], timeout: float = 10.0, what: str = "condition") -> T:
    deadline = time.monotonic() + timeout
    delay = 0.005
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {value!r})")
        time.sleep(delay)
        delay = min(delay * 2, 0.1)
