"""Children that are started again when they exit: ``epp stack``'s simulators, sidecars
and EPP replicas. Each comes back on the ports it had (the flags ``pins`` names get the
values its ready file gave), so whatever knew it there (Envoy's clusters, the EPP's
endpoints, the other replicas' peer-load sockets) finds it again; a child that keeps
exiting soon after its start waits longer each time (:mod:`epp.common.restarts`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from epp.common.readyfile import read_ready
from epp.common.restarts import Restarts
from epp_harness.procs import ManagedProcess

# A child that exits is started again after this long, doubling with each exit soon
# after a start up to the maximum; one that stayed up STABLE_AFTER_S starts over.
RESTART_BACKOFF_S = 0.5
MAX_RESTART_BACKOFF_S = 10.0
STABLE_AFTER_S = 30.0

# a child's ready-file info -> the flags that put it back where it was, and their values
Pins = Callable[[Mapping[str, Any]], dict[str, str]]


@dataclass
class _Child:
    proc: ManagedProcess
    pins: Pins
    restarts: Restarts = field(
        default_factory=lambda: Restarts(RESTART_BACKOFF_S, MAX_RESTART_BACKOFF_S, STABLE_AFTER_S)
    )
    due: float = 0.0  # when to start it again; 0: it is not waiting for a restart
    started: float = 0.0  # when it was last (re)started
    back: bool = True  # its ready file was seen since the last (re)start


class Supervisor:
    def __init__(self) -> None:
        self._children: list[_Child] = []

    def add(self, proc: ManagedProcess, pins: Pins, now: float) -> None:
        """Watch ``proc`` (started at ``now`` and ready: its info is known)."""
        self._children.append(_Child(proc, pins, started=now))

    def remove(self, proc: ManagedProcess) -> None:
        """Stop watching ``proc``: it is not started again when it exits."""
        self._children = [c for c in self._children if c.proc is not proc]

    def check(self, now: float) -> list[str]:
        """Restart the children that exited, each once its wait is over; returns what
        happened, for the log."""
        events: list[str] = []
        for child in self._children:
            event = self._check(child, now)
            if event is not None:
                events.append(event)
        return events

    def _check(self, child: _Child, now: float) -> str | None:
        proc = child.proc
        if proc.alive():
            ready = proc.ready_file
            info = None if child.back or ready is None else read_ready(ready)
            if info is None:
                return None
            proc.info, child.back = info, True
            return f"{proc.name} is back (restart {child.restarts.count}): {_flags(child)}"
        if child.due == 0.0:  # just found dead
            code = proc.proc.returncode if proc.proc is not None else None
            wait_s = child.restarts.exited(now - child.started)
            child.due = now + wait_s
            return child.restarts.describe(proc.name, code, wait_s)
        if now < child.due:
            return None
        proc.restart(pinned(proc.argv, child.pins(proc.info)))
        child.due, child.started, child.back = 0.0, now, False
        return f"{proc.name} started again (restart {child.restarts.count}): {_flags(child)}"


def _flags(child: _Child) -> str:
    return " ".join(f"{flag} {value}" for flag, value in child.pins(child.proc.info).items())


def pinned(argv: list[str], flags: Mapping[str, str]) -> list[str]:
    """``argv`` with each of ``flags`` given its value: replaced where the flag is,
    added at the end where it is not."""
    out = list(argv)
    for flag, value in flags.items():
        if flag in out:
            out[out.index(flag) + 1] = value
        else:
            out += [flag, value]
    return out
