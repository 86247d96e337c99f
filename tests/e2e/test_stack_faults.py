"""`epp stack` under faults, run as a user runs it: a simulator SIGKILLed under load is
restarted on its port with no client error; a SIGKILLed `epp stack` leaves no child."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest

from epp.readyfile import read_ready
from epp_harness.procs import epp_argv
from tests.e2e.test_stack_cli import processes_using
from tests.support.load import Load
from tests.support.wait import wait_for

pytestmark = pytest.mark.e2e

BODY = orjson.dumps({"model": "sim-model", "prompt": "still there?", "max_tokens": 4})


@dataclass
class RunningStack:
    proc: subprocess.Popen[bytes]
    out: Path
    workdir: Path
    url: str

    def sim_pid(self, name: str) -> int:
        """The pid of the simulator called ``name`` (its ready file is in its argv)."""
        marker = str(self.workdir / f"{name}.ready").encode()
        for pid in processes_using(self.workdir):
            try:
                if marker in Path(f"/proc/{pid}/cmdline").read_bytes():
                    return pid
            except OSError:
                continue
        raise LookupError(name)


@pytest.fixture
def running(tmp_path: Path) -> Iterator[RunningStack]:
    out, workdir = tmp_path / "stack.out", tmp_path / "work"
    argv = epp_argv(
        "stack", "--servers", "3", "--envoy-port", "0", "--envoy-admin-port", "0",
        "--grpc-port", "0", "--http-port", "0", "--time-scale", "0.05",
        "--workdir", str(workdir),
    )  # fmt: skip
    with open(out, "wb") as f:
        proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: b"Ctrl-C stops everything" in out.read_bytes(), 60, "the banner")
        url = out.read_text().split("Envoy (send requests here)", 1)[1].split()[0]
        yield RunningStack(proc, out, workdir, url)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.wait(30)


def test_killed_simulator_is_restarted_on_its_port_with_no_client_error(
    running: RunningStack,
) -> None:
    port = read_ready(running.workdir / "sim-0.ready")["port"]  # type: ignore[index]
    address = f"127.0.0.1:{port}"
    with Load(f"{running.url}/v1/completions", [BODY] * 6) as load:
        wait_for(lambda: load.served_by(address), what="load on sim-0")
        victim = running.sim_pid("sim-0")
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: b"sim-0 is back" in running.out.read_bytes(), 30, "the restart")
        assert running.sim_pid("sim-0") != victim
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
    assert "sim-0 exited (code -9); restarting it" in log
    assert running.proc.poll() is None


def test_killed_stack_leaves_no_child(running: RunningStack) -> None:
    children = processes_using(running.workdir)
    assert len(children) >= 5  # 3 simulators, the EPP, Envoy
    running.proc.kill()
    running.proc.wait()
    wait_for(lambda: not processes_using(running.workdir), 15, "every child to exit")
