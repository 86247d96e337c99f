"""`epp stack` keeps serving when an EPP replica or worker dies, run as a user runs it:
a SIGKILLed replica costs at most the requests open on it, comes back on its ports and
rejoins Envoy's ext_proc cluster and the other replica's in-flight sharing; a SIGKILLed
worker is restarted by its parent, and a SIGKILLed parent of workers by the stack, its
workers on their ports again. Envoy, the simulators and the other replica stay the same
processes throughout."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.support.http import get_json, metric_samples
from tests.support.load import Load
from tests.support.stackcli import metric, running_stack
from tests.support.wait import wait_for

# the slow tier (make test-slow): `make test` covers a killed replica of `epp stack`
# (scenario seed 11) and a killed worker (test_workers.py) more cheaply
pytestmark = [pytest.mark.e2e, pytest.mark.slow]

BODY = orjson.dumps({"model": "sim-model", "prompt": "still routed?", "max_tokens": 4})
CLIENTS = 4  # requests open at once: at most this many can be open on the one killed
APPLIED = 'epp_peer_load_frames_total{outcome="applied"}'


def serves(http_port: int) -> bool:
    """The EPP (or worker) on ``http_port`` has routed a request since it started (False
    while nothing listens there: a worker's new port reaches /workers once it listens)."""
    try:
        return metric(http_port, "epp_requests_total") > 0
    except OSError:
        return False


def applied_frames(http_port: int) -> float:
    return metric_samples(f"http://127.0.0.1:{http_port}/metrics").get(APPLIED, 0.0)


def late_errors(load: Load, since: float) -> list[Any]:
    """The failed requests sent after ``since`` (time.monotonic())."""
    return [r for r in load.errors() if r.started >= since]


def test_a_killed_replica_comes_back_on_its_ports_and_rejoins(tmp_path: Path) -> None:
    with running_stack(tmp_path, "--servers", "2", "--replicas", "2") as stack:
        same = {name: stack.pid(name) for name in ("envoy", "epp", "sim-0", "sim-1")}
        victim, before = stack.pid("epp-1"), stack.ready("epp-1")
        http, survivor = before["http_port"], stack.ready("epp")["http_port"]
        with Load(f"{stack.url}/v1/completions", [BODY] * CLIENTS) as load:
            wait_for(lambda: serves(http) and serves(survivor), 30, "both replicas routing")
            os.kill(victim, signal.SIGKILL)
            killed = time.monotonic()
            stack.wait_output("epp-1 exited (killed by SIGKILL); restart 1 in 0.5s")
            stack.wait_output("epp-1 is back (restart 1)")
            back = time.monotonic()
            after = stack.ready("epp-1")
            assert stack.pid("epp-1") != victim
            assert (after["grpc_port"], after["http_port"]) == (before["grpc_port"], http)
            # Envoy gives it streams again (its port is still in the ext_proc cluster)
            wait_for(lambda: serves(http), 30, "the restarted replica routing")
            # it follows the other replica's in-flight counts, and the other follows it:
            # the dead one's frames ended before the restart, so new ones are its own
            wait_for(lambda: metric(http, "epp_peers") == 1, what="it following the other")
            seen = applied_frames(survivor)
            wait_for(lambda: applied_frames(survivor) > seen + 1, what="the other following it")
            done = len(load.results)
            wait_for(lambda: len(load.results) > done + 50, 30, "load after the restart")
        errors = load.errors()
        print(
            f"replica kill: {len(load.results)} requests, {len(errors)} errors; the "
            f"replica was back {back - killed:.1f}s after the kill"
        )
        assert len(errors) <= CLIENTS, errors
        assert late_errors(load, back) == []
        assert {name: stack.pid(name) for name in same} == same
        assert stack.proc.poll() is None, stack.output()


def test_a_killed_worker_and_a_killed_parent_come_back_on_their_ports(tmp_path: Path) -> None:
    with running_stack(tmp_path, "--servers", "2", "--workers", "2") as stack:
        same = {name: stack.pid(name) for name in ("envoy", "sim-0", "sim-1")}
        info = stack.ready("epp")
        parent, http, ports = stack.pid("epp"), info["http_port"], info["grpc_ports"]

        def workers() -> list[dict[str, Any]]:
            listed: list[dict[str, Any]] = get_json(f"http://127.0.0.1:{http}/workers")["workers"]
            return listed

        def restarted(old: int) -> dict[str, Any] | None:
            w = workers()[1]
            return w if w["connected"] and w["pid"] not in (None, old) else None

        with Load(f"{stack.url}/v1/completions", [BODY] * CLIENTS) as load:
            victim = workers()[1]
            wait_for(lambda: serves(victim["http_port"]), 30, "worker 1 routing")
            os.kill(victim["pid"], signal.SIGKILL)
            killed = time.monotonic()
            worker = wait_for(lambda: restarted(victim["pid"]), 30, "worker 1 restarted")
            assert (worker["grpc_port"], worker["restarts"]) == (ports[1], 1)
            worker_back = time.monotonic() - killed
            wait_for(lambda: serves(workers()[1]["http_port"]), 30, "the restarted worker routing")
            log = (stack.workdir / "epp.log").read_text()
            assert f"worker 1 (port {ports[1]}) exited (killed by SIGKILL); restart 1" in log
            assert stack.pid("epp") == parent
            worker_errors = len(load.errors())

            # the parent itself: the stack starts it again, its workers on their ports
            os.kill(parent, signal.SIGKILL)
            killed = time.monotonic()
            stack.wait_output("epp exited (killed by SIGKILL); restart 1 in 0.5s")
            stack.wait_output("epp is back (restart 1)", timeout=60)
            back = time.monotonic()
            assert stack.ready("epp")["grpc_ports"] == ports
            assert [w["grpc_port"] for w in workers()] == ports
            for w in workers():
                wait_for(lambda w=w: serves(w["http_port"]), 30, f"worker {w['index']} routing")
            done = len(load.results)
            wait_for(lambda: len(load.results) > done + 50, 30, "load after the restart")
        print(
            f"worker kill: {worker_errors} errors, back {worker_back:.1f}s after; parent kill: "
            f"{len(load.errors()) - worker_errors} errors, back {back - killed:.1f}s after; "
            f"{len(load.results)} requests"
        )
        assert worker_errors <= CLIENTS
        assert late_errors(load, back) == []
        assert {name: stack.pid(name) for name in same} == same
        assert stack.proc.poll() is None, stack.output()
