"""A scenario's fault schedule, applied while the driver runs: once ``after`` requests
are answered the fault strikes (for a mid-stream kill or freeze, while a stream the
victim answered is under way), and where it heals on its own terms (a frozen server
thawed, injected statuses cleared, a removed server added back) it heals ``heal_after``
answers later (a freeze lasts at least a stream's first-byte budget). A frozen server
is always thawed before this returns."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable

import orjson

from tests.scenarios.deploy import ADMIN_KEY, Deployment, InProcess, Server
from tests.scenarios.drive import Driver
from tests.scenarios.model import FaultEvent, Scenario, stream_first_byte_s
from tests.support.http import get_json, request

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


def _admin(d: Deployment, path: str, doc: dict[str, object]) -> None:
    for url in d.epp_http_urls():
        key = {"X-Api-Key": ADMIN_KEY}
        status, _, body = request(f"{url}{path}", orjson.dumps(doc), headers=key)
        assert status == 200, f"{path} {doc}: {status} {body[:300]!r}"


def _until(driver: Driver, answers: int) -> None:
    """Until ``answers`` more requests are answered (or the load is over)."""
    at = driver.answered() + answers
    _wait(lambda: driver.answered() >= at, driver, HEAL_WAIT_S)


def apply(s: Scenario, d: Deployment, driver: Driver) -> list[FaultEvent]:
    """Run the schedule to its end; returns what happened and when."""
    f = s.fault
    if f.kind == "none":
        return []
    _wait(lambda: driver.answered() >= f.after, driver, HEAL_WAIT_S)
    if f.kind == "epp-replica-kill":
        replica = f.target % len(d.epp_http_urls())  # fail-open has one
        pid = d.epp_pid(replica)
        event = FaultEvent(f.kind, time.monotonic(), victim=f"epp replica {replica}")
        os.kill(pid, signal.SIGKILL)  # dated before the signal, as a server's below
        return [event]
    if f.kind == "epp-worker-kill":
        workers = get_json(f"{d.epp_http_urls()[0]}/workers")["workers"]
        worker = f.target % len(workers)
        event = FaultEvent(f.kind, time.monotonic(), victim=f"epp worker {worker}")
        os.kill(int(workers[worker]["pid"]), signal.SIGKILL)
        return [event]
    if f.kind == "envoy-restart":
        assert isinstance(d, InProcess)
        event = FaultEvent(f.kind, time.monotonic(), victim="envoy")
        d.restart_envoy()
        event.until = time.monotonic()
        return [event]
    victim = [srv for srv in d.servers() if srv.decodes][f.target]
    if f.kind in ("fault-status", "metrics-fault"):
        _set_faults(victim, {"status": f.statuses, "seed": s.seed, "metrics": f.metrics or "ok"})
        event = FaultEvent(f.kind, time.monotonic(), victim=victim.address)
        _until(driver, f.heal_after)
        _set_faults(victim, {"status": "", "metrics": "ok"})
        event.until = time.monotonic()
        return [event]
    if f.kind == "admin-remove-add":  # drained and removed under traffic, added back
        role = {"type": "decode", "instance": victim.in_epp}
        event = FaultEvent(f.kind, time.monotonic(), victim=victim.address)
        _admin(d, "/instances/remove", role)
        _until(driver, f.heal_after)
        _admin(d, "/instances/add", role)
        event.until = time.monotonic()
        return [event]
    if f.kind == "restart-new-port":  # stopped; a new one on another port takes its place
        assert isinstance(d, InProcess)
        event = FaultEvent(f.kind, time.monotonic(), victim=victim.address)
        new = d.replace_server(victim)
        _admin(d, "/instances/remove", {"type": "decode", "instance": victim.in_epp})
        _admin(d, "/instances/add", {"type": "decode", "instance": new.in_epp})
        event.until, event.rejoin = time.monotonic(), new.address
        return [event]
    if f.kind.endswith("-mid-stream"):  # a stream of its own under way: its client waits
        _wait(lambda: driver.streams_under_way(victim.address) > 0, driver, STRIKE_WAIT_S)
    pid = d.server_pid(victim.name)
    # dated before the signal: a client can see its cut before os.kill returns, and the
    # invariants explain a failure by a fault that struck while it ran
    event = FaultEvent(f.kind, time.monotonic(), victim=victim.address)
    if f.kind == "restart-same-port":  # stopped cleanly; the stack starts it again
        os.kill(pid, signal.SIGTERM)
        return [event]
    if f.kind.startswith("sigkill") or f.kind == "kv-publisher-restart":
        os.kill(pid, signal.SIGKILL)
        return [event]
    os.kill(pid, signal.SIGSTOP)
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
