"""epp_harness.procs: children told to stop all at once wind down side by side, and each
gets one SIGTERM however it is stopped."""

from __future__ import annotations

import sys
from pathlib import Path

from epp_harness.procs import ManagedProcess
from tests.support.wait import wait_for

# Announces itself in the ready file; on SIGTERM writes its "got" file, waits until its
# release file exists and exits with the number of SIGTERMs it got.
CHILD = """
import pathlib, signal, sys, time
ready, got_file, release = map(pathlib.Path, sys.argv[1:4])
got = []
signal.signal(signal.SIGTERM, lambda *_: got.append(1))
ready.write_text('{"ok": true}')
while not got:
    time.sleep(0.01)
got_file.touch()
while not release.exists():
    time.sleep(0.01)
time.sleep(0.2)  # a second SIGTERM sent while it winds down would still be counted
sys.exit(len(got))
"""


def child(tmp_path: Path, name: str) -> ManagedProcess:
    ready, got, release = (tmp_path / f"{name}.{what}" for what in ("ready", "got", "release"))
    proc = ManagedProcess(
        name,
        [sys.executable, "-c", CHILD, str(ready), str(got), str(release)],
        ready_file=ready,
        log_path=tmp_path / f"{name}.log",
    ).start()
    proc.wait_ready()
    return proc


def test_terminated_children_wind_down_together_and_get_one_sigterm(tmp_path: Path) -> None:
    a, b = child(tmp_path, "a"), child(tmp_path, "b")
    a.terminate()
    b.terminate()
    # both were told before either is waited for
    wait_for(lambda: (tmp_path / "a.got").exists() and (tmp_path / "b.got").exists(),
             what="both children to get their SIGTERM")  # fmt: skip
    (tmp_path / "a.release").touch()
    (tmp_path / "b.release").touch()
    assert a.stop(timeout=60) == 1  # stop() sent no second SIGTERM
    assert b.stop(timeout=60) == 1


def test_stop_alone_sends_the_sigterm(tmp_path: Path) -> None:
    proc = child(tmp_path, "c")
    (tmp_path / "c.release").touch()
    assert proc.stop(timeout=60) == 1


def test_a_restarted_child_is_told_again(tmp_path: Path) -> None:
    proc = child(tmp_path, "d")
    (tmp_path / "d.release").touch()
    proc.terminate()
    assert proc.stop(timeout=60) == 1
    proc.restart()
    proc.wait_ready()
    proc.terminate()
    assert proc.stop(timeout=60) == 1
