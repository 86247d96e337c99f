"""A child process that keeps exiting: how long to wait before starting it again, and
how to say what happened. ``epp serve --workers`` restarts its workers with it, ``epp
stack`` its simulators, sidecars and EPP replicas.

The wait doubles with each exit that came soon after a start (a crash loop: a bad flag,
a port someone else holds) up to a ceiling, and starts over once a child stayed up."""

from __future__ import annotations

import signal
from dataclasses import dataclass


def exit_reason(code: int | None) -> str:
    """``code`` as a person reads it: ``code 3``, ``killed by SIGKILL``."""
    if code is None:
        return "code unknown"
    if code >= 0:
        return f"code {code}"
    try:
        return f"killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"killed by signal {-code}"


@dataclass
class Restarts:
    """One child's restarts so far, and the wait before the next."""

    first_s: float  # the wait after an exit that ends a good run
    max_s: float  # the longest wait
    steady_s: float  # up this long, the child ran well: the next exit waits first_s
    count: int = 0  # restarts so far (each exit is one)
    in_a_row: int = 0  # exits, each within steady_s of its start

    def exited(self, up_s: float) -> float:
        """Count an exit after ``up_s`` seconds up; the wait before starting it again."""
        self.in_a_row = self.in_a_row + 1 if up_s < self.steady_s else 1
        self.count += 1
        wait_s: float = self.first_s * 2.0 ** (self.in_a_row - 1)
        return min(wait_s, self.max_s)

    def describe(self, name: str, code: int | None, wait_s: float) -> str:
        """The log line for an exit :meth:`exited` just counted."""
        line = f"{name} exited ({exit_reason(code)}); restart {self.count} in {wait_s:g}s"
        if self.in_a_row > 1:
            line += (
                f": crash loop, it exited {self.in_a_row} times in a row within "
                f"{self.steady_s:g}s of starting; backing off (at most {self.max_s:g}s)"
            )
        return line
