"""The stack's supervisor with real child processes and a clock of the test's own: a
child that dies is started again on the ports its ready file gave, after a wait that
doubles while it keeps dying at start (said in the log as a crash loop), and starts over
once it ran well."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from epp_harness.procs import ManagedProcess
from epp_harness.supervisor import STABLE_AFTER_S, Supervisor, pinned

# exits with code 3 while FAIL exists; else says it is ready on --port (7 for 0) and waits
CHILD = """
import os, sys, time
from epp.common.readyfile import write_ready
args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
if os.path.exists(args["--fail"]):
    sys.exit(3)
write_ready(args["--ready"], {"port": int(args["--port"]) or 7})
time.sleep(600)
"""


def port_pins(info: Mapping[str, Any]) -> dict[str, str]:
    return {"--port": str(info["port"])}


@pytest.fixture
def child(tmp_path: Path) -> Iterator[ManagedProcess]:
    ready, fail = tmp_path / "child.ready", tmp_path / "fail"
    argv = [sys.executable, "-c", CHILD, "--port", "0", "--ready", str(ready), "--fail", str(fail)]
    proc = ManagedProcess("child", argv, ready_file=ready, log_path=tmp_path / "child.log")
    proc.start().wait_ready()
    yield proc
    proc.stop()


def died(proc: ManagedProcess) -> None:
    assert proc.proc is not None
    proc.proc.wait(30)


def test_a_child_that_keeps_dying_at_start_backs_off_and_comes_back_on_its_port(
    child: ManagedProcess, tmp_path: Path
) -> None:
    supervisor = Supervisor()
    supervisor.add(child, port_pins, now=0.0)
    assert supervisor.check(1.0) == []  # alive, nothing to do
    fail = tmp_path / "fail"
    fail.touch()
    os.kill(child.pid, signal.SIGKILL)
    died(child)
    t = 100.0
    assert supervisor.check(t) == ["child exited (killed by SIGKILL); restart 1 in 0.5s"]
    assert supervisor.check(t + 0.4) == []  # not yet
    assert supervisor.check(t + 0.5) == ["child started again (restart 1): --port 7"]
    assert child.argv[child.argv.index("--port") + 1] == "7"
    died(child)  # exit 3: FAIL is there
    t += 0.6
    for restart, wait_s in ((2, 1.0), (3, 2.0)):
        assert supervisor.check(t) == [
            f"child exited (code 3); restart {restart} in {wait_s:g}s: crash loop, it exited "
            f"{restart} times in a row within {STABLE_AFTER_S:g}s of starting; backing off "
            "(at most 10s)"
        ]
        assert supervisor.check(t + wait_s - 0.1) == []
        if restart == 3:
            fail.unlink()
        t += wait_s
        assert supervisor.check(t) == [f"child started again (restart {restart}): --port 7"]
        if restart == 2:
            died(child)
        t += 0.1
    child.wait_ready()
    assert supervisor.check(t) == ["child is back (restart 3): --port 7"]
    assert supervisor.check(t + 0.1) == []
    # up long enough: the next death waits the shortest time again, no crash loop
    os.kill(child.pid, signal.SIGKILL)
    died(child)
    assert supervisor.check(t + STABLE_AFTER_S) == [
        "child exited (killed by SIGKILL); restart 4 in 0.5s"
    ]


def test_pinned_replaces_a_flag_given_and_adds_one_missing() -> None:
    argv = ["epp", "serve", "--grpc-port", "0", "--ready-file", "r"]
    assert pinned(argv, {"--grpc-port": "9002", "--worker-ports": "9100,9101"}) == [
        "epp", "serve", "--grpc-port", "9002", "--ready-file", "r", "--worker-ports", "9100,9101",
    ]  # fmt: skip
