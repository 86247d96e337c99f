"""Child processes: start, wait until ready (via ready file), stop cleanly.

Used by ``epp stack``, the benchmarks and the tests: one mechanism for all of them.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from epp.common.readyfile import read_ready


class ProcessFailed(RuntimeError):
    """A child exited or did not become ready in time."""


_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _die_with_parent(parent: int) -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child get SIGKILL when its parent dies, however
    it dies (SIGKILL included), so no child of ``epp stack`` outlives it. Linux only
    (elsewhere: None, no such guarantee). The kernel sends the signal when the *thread*
    that started the child ends: start children from a thread that lives as long as
    they should (the main thread, in ``epp stack`` and the tests)."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)

    def preexec() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return preexec


class ManagedProcess:
    """One child process whose readiness is announced through a ready file."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        ready_file: Path | None = None,
        log_path: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.ready_file = ready_file
        self.log_path = log_path
        self._env = env
        self._log: IO[bytes] | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.info: dict[str, Any] = {}
        self._terminated = False  # SIGTERM sent to this run of the child

    def start(self) -> ManagedProcess:
        if self.ready_file is not None and self.ready_file.exists():
            self.ready_file.unlink()
        out: IO[bytes] | int
        if self.log_path is not None:
            self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
            out = self._log
        else:
            out = subprocess.DEVNULL
        env = dict(os.environ if self._env is None else self._env)
        self._terminated = False
        self.proc = subprocess.Popen(
            self.argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=False,
            preexec_fn=_die_with_parent(os.getpid()),
        )
        return self

    def restart(self, argv: Sequence[str] | None = None) -> ManagedProcess:
        """Start the (dead) child again, with ``argv`` if given; returns at once (call
        wait_ready() to wait). Its log file continues."""
        assert not self.alive(), f"{self.name} is still running"
        if self._log is not None:
            self._log.close()
            self._log = None
        if argv is not None:
            self.argv = list(argv)
        return self.start()

    @property
    def pid(self) -> int:
        assert self.proc is not None, "process not started"
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        if self.log_path is None or not self.log_path.exists():
            return "(no log)"
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def wait_ready(
        self, timeout: float = 90.0, probe: Callable[[], dict[str, Any] | None] | None = None
    ) -> dict[str, Any]:
        """Block until ``probe`` (default: read the ready file) returns info; raise
        ProcessFailed if the child dies first or time runs out."""
        assert self.proc is not None
        if probe is None:
            assert self.ready_file is not None, "no ready file and no probe"
            ready_file = self.ready_file
            probe = lambda: read_ready(ready_file)  # noqa: E731
        deadline = time.monotonic() + timeout
        delay = 0.005
        while time.monotonic() < deadline:
            info = probe()
            if info is not None:
                self.info = info
                return info
            code = self.proc.poll()
            if code is not None:
                raise ProcessFailed(
                    f"{self.name} exited with code {code} before it was ready:\n{self.log_tail()}"
                )
            time.sleep(delay)
            delay = min(delay * 2, 0.1)
        raise ProcessFailed(f"{self.name} not ready after {timeout:.0f}s:\n{self.log_tail()}")

    def terminate(self) -> None:
        """Send SIGTERM once and return at once; :meth:`stop` then waits. Children told
        first and waited for after wind down side by side, not one after another."""
        if self.proc is not None and not self._terminated and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self._terminated = True

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM (unless :meth:`terminate` sent it), then SIGKILL after ``timeout``;
        returns the exit code."""
        code: int | None = None
        if self.proc is not None:
            if self.proc.poll() is None:
                self.terminate()
                try:
                    self.proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
            code = self.proc.returncode
        if self._log is not None:
            self._log.close()
            self._log = None
        return code


def epp_argv(*args: str) -> list[str]:
    """argv that runs our own CLI with the current interpreter (works inside any venv)."""
    return [sys.executable, "-m", "epp", *args]


def scratch_dir(prefix: str = "epp-") -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix))


def spawn_epp(
    workdir: Path, name: str, *args: str, env: Mapping[str, str] | None = None
) -> ManagedProcess:
    """Start ``epp ARGS... --ready-file WORKDIR/NAME.ready`` logging to WORKDIR/NAME.log,
    with ``env`` added to this process's environment. Returns at once (so several
    children can start in parallel): call wait_ready()."""
    ready = workdir / f"{name}.ready"
    return ManagedProcess(
        name,
        epp_argv(*args, "--ready-file", str(ready)),
        ready_file=ready,
        log_path=workdir / f"{name}.log",
        env={**os.environ, **env} if env else None,
    ).start()


def start_epp(workdir: Path, name: str, *args: str) -> ManagedProcess:
    """:func:`spawn_epp` and wait until it is ready; stop it again if it fails."""
    proc = spawn_epp(workdir, name, *args)
    try:
        proc.wait_ready()
    except BaseException:
        proc.stop()
        raise
    return proc
