"""`epp stack` under faults, run as a user runs it: a simulator SIGKILLed under load is
restarted on its port with no client error; a SIGKILLed `epp stack` leaves no child."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from tests.support.load import Load
from tests.support.stackcli import RunningStack, processes_using, running_stack
from tests.support.wait import wait_for

pytestmark = pytest.mark.e2e

BODY = orjson.dumps({"model": "sim-model", "prompt": "still there?", "max_tokens": 4})


@pytest.fixture
def running(tmp_path: Path) -> Iterator[RunningStack]:
    with running_stack(tmp_path, "--servers", "3") as stack:
        yield stack


def test_killed_simulator_is_restarted_on_its_port_with_no_client_error(
    running: RunningStack,
) -> None:
    port = running.ready("sim-0")["port"]
    address = f"127.0.0.1:{port}"
    with Load(f"{running.url}/v1/completions", [BODY] * 6) as load:
        wait_for(lambda: load.served_by(address), what="load on sim-0")
        victim = running.pid("sim-0")
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: b"sim-0 is back" in running.out.read_bytes(), 30, "the restart")
        assert running.pid("sim-0") != victim
        assert running.proc.poll() is None, running.out.read_text()
        back = len(load.results)
        wait_for(
            lambda: load.served_by(address, since=back),
            timeout=30,
            what="traffic on the restarted server (same address)",
        )
    log = running.out.read_text()
    print(f"stack kill test: {len(load.results)} requests, {len(load.errors())} errors")
    assert load.errors() == [] and len(load.results) > 50
    assert "sim-0 exited (killed by SIGKILL); restart 1 in 0.5s" in log
    assert running.proc.poll() is None


def test_killed_stack_leaves_no_child(running: RunningStack) -> None:
    children = processes_using(running.workdir)
    assert len(children) >= 5  # 3 simulators, the EPP, Envoy
    running.proc.kill()
    running.proc.wait()
    wait_for(lambda: not processes_using(running.workdir), 15, "every child to exit")
