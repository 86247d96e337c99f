"""``epp stack`` run as a user runs it (a child process on free ports), for fault tests:
its output, its work directory and the pids of what it started."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from epp.common.readyfile import read_ready
from epp_harness.procs import epp_argv
from tests.support.http import metric_sum, request
from tests.support.wait import wait_for


def processes_using(workdir: Path) -> list[int]:
    """PIDs whose command line mentions ``workdir`` (our children all do)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if str(workdir).encode() in cmdline and int(pid) != os.getpid():
            found.append(int(pid))
    return found


@dataclass
class RunningStack:
    proc: subprocess.Popen[bytes]
    out: Path
    workdir: Path
    url: str

    def pid(self, name: str) -> int:
        """The pid of the child called ``name`` (its ready file, or for ``envoy`` its
        config, is in its argv; a replica's workers name neither)."""
        file = "envoy.yaml" if name == "envoy" else f"{name}.ready"
        marker = str(self.workdir / file).encode()
        for pid in processes_using(self.workdir):
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if marker in argv and b"--worker-link" not in argv:
                return pid
        raise LookupError(name)

    def ready(self, name: str) -> dict[str, Any]:
        info = read_ready(self.workdir / f"{name}.ready")
        assert info is not None, f"{name} is not ready"
        return info

    def output(self) -> str:
        return self.out.read_text()

    def wait_output(self, text: str, timeout: float = 30.0) -> None:
        wait_for(lambda: text in self.output(), timeout, repr(text))


def metric(http_port: int, name: str) -> float:
    """The sum of ``name``'s samples on an EPP's (or a worker's) /metrics."""
    _, _, body = request(f"http://127.0.0.1:{http_port}/metrics")
    return metric_sum(body.decode(), name)


@contextmanager
def running_stack(
    tmp_path: Path,
    *flags: str,
    env: Mapping[str, str] | None = None,
    adapt: Callable[[list[str]], list[str]] | None = None,
) -> Iterator[RunningStack]:
    """``epp stack --time-scale 0.05 FLAGS`` on free ports, once its banner is out;
    stopped with Ctrl-C (SIGINT) at the end. ``env`` is added to its environment and
    ``adapt`` rewrites its argv (command first): another checkout's ``epp stack``
    (tests/scenarios/eppfrom.py)."""
    out, workdir = tmp_path / "stack.out", tmp_path / "work"
    args = [
        "stack", "--envoy-port", "0", "--envoy-admin-port", "0", "--grpc-port", "0",
        "--http-port", "0", "--time-scale", "0.05", "--workdir", str(workdir), *flags,
    ]  # fmt: skip
    argv = epp_argv(*(adapt(args) if adapt else args))
    with open(out, "wb") as f:
        proc = subprocess.Popen(
            argv, stdout=f, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )
    try:
        wait_for(lambda: b"Ctrl-C stops everything" in out.read_bytes(), 60, "the banner")
        url = out.read_text().split("Envoy (send requests here)", 1)[1].split()[0]
        yield RunningStack(proc, out, workdir, url)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.wait(30)
        else:
            proc.wait()
