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
from tests.scenarios.model import FaultEvent, Scenario
from tests.support.http import get_json, request

# waits that end on an event; these bound them only if the event never comes
STRIKE_WAIT_S = 20.0
HEAL_WAIT_S = 30.0


def _wait(condition: Callable[[], bool], driver: Driver, within: float) -> None:
    """Until ``condition`` holds or the load is over (or ``within`` passes)."""
    deadline = time.monotonic() + within
    while not condition() and not driver.done.is_set() and time.monotonic() < deadline:
        time.sleep(0.005)


def _generating(server: Server) -> bool:
    try:
        return int(get_json(f"http://{server.address}/sim/stats")["running"]) > 0
    except (OSError, AssertionError):
        return False


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
    if f.kind.endswith("-mid-stream"):
        _wait(lambda: _generating(victim), driver, STRIKE_WAIT_S)
    pid = d.server_pid(victim.name)
    if f.kind.startswith("sigkill"):
        os.kill(pid, signal.SIGKILL)
        return [FaultEvent(f.kind, time.monotonic(), victim=victim.address)]
    os.kill(pid, signal.SIGSTOP)
    event = FaultEvent(f.kind, time.monotonic(), victim=victim.address)
    try:
        thawed_at = driver.answered() + f.heal_after
        _wait(lambda: driver.answered() >= thawed_at, driver, HEAL_WAIT_S)
    finally:
        os.kill(pid, signal.SIGCONT)
        event.until = time.monotonic()
    return [event]
