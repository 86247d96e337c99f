"""A scenario's fault schedule, applied while the driver runs: once ``after`` requests
are answered the fault strikes (for a mid-stream kill or freeze, at a moment the victim
is generating), and where it heals on its own terms (a frozen server thawed, injected
statuses cleared) it heals ``heal_after`` answers later. A frozen server is always
thawed before this returns."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable

import orjson

from tests.scenarios.deploy import Deployment, Server
from tests.scenarios.drive import Driver
from tests.scenarios.model import FaultEvent, Scenario, stream_first_byte_s
from tests.support.http import request

# waits that end on an event; these bound them only if the event never comes
STRIKE_WAIT_S = 20.0
HEAL_WAIT_S = 30.0


def _wait(condition: Callable[[], bool], driver: Driver, within: float) -> None:
    """Until ``condition`` holds or the load is over (or ``within`` passes)."""
    deadline = time.monotonic() + within
    while not condition() and not driver.done.is_set() and time.monotonic() < deadline:
        time.sleep(0.005)


def _set_faults(server: Server, doc: dict[str, object]) -> None:
    status, _, body = request(f"http://{server.address}/sim/faults", orjson.dumps(doc))
    assert status == 200, body


def apply(s: Scenario, d: Deployment, driver: Driver) -> list[FaultEvent]:
    """Run the schedule to its end; returns what happened and when."""
    f = s.fault
    if f.kind == "none":
        return []
    _wait(lambda: driver.answered() >= f.after, driver, HEAL_WAIT_S)
    if f.kind == "epp-replica-kill":
        os.kill(d.epp_pid(f.target), signal.SIGKILL)
        return [FaultEvent(f.kind, time.monotonic(), victim=f"epp replica {f.target}")]
    victim = [srv for srv in d.servers() if srv.decodes][f.target]
    if f.kind in ("fault-status", "metrics-fault"):
        _set_faults(victim, {"status": f.statuses, "seed": s.seed, "metrics": f.metrics or "ok"})
        event = FaultEvent(f.kind, time.monotonic(), victim=victim.address)
        healed_at = driver.answered() + f.heal_after
        _wait(lambda: driver.answered() >= healed_at, driver, HEAL_WAIT_S)
        _set_faults(victim, {"status": "", "metrics": "ok"})
        event.until = time.monotonic()
        return [event]
    if f.kind.endswith("-mid-stream"):  # a stream of its own under way: its client waits
        _wait(lambda: driver.streams_under_way(victim.address) > 0, driver, STRIKE_WAIT_S)
    pid = d.server_pid(victim.name)
    if f.kind.startswith("sigkill"):
        os.kill(pid, signal.SIGKILL)
        return [FaultEvent(f.kind, time.monotonic(), victim=victim.address)]
    os.kill(pid, signal.SIGSTOP)
    event = FaultEvent(f.kind, time.monotonic(), victim=victim.address)
    # frozen for a drawn number of answers, and at least for the longest per-try budget
    # (a stream's first byte), so every timeout the freeze should trip has tripped
    frozen_until = event.at + stream_first_byte_s(f.kind)
    try:
        thawed_at = driver.answered() + f.heal_after
        _wait(
            lambda: driver.answered() >= thawed_at and time.monotonic() >= frozen_until,
            driver,
            HEAL_WAIT_S,
        )
    finally:
        os.kill(pid, signal.SIGCONT)
        event.until = time.monotonic()
    return [event]
