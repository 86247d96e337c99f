"""`epp top` in a pseudo-terminal against a running stack (Envoy -> EPP -> simulators):
with traffic flowing, every endpoint gets a row and a non-zero request rate shows; `q`
and Ctrl-C each end it cleanly."""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import orjson
import pytest

from epp_harness.stack import LocalStack
from tests.e2e.conftest import ephemeral
from tests.support.http import request

pytestmark = pytest.mark.e2e

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
REQ_S = 7  # the REQ/S column of a row
HIT = 9  # PREFIX HIT


@pytest.fixture(scope="module")
def stack() -> Iterator[LocalStack]:
    with LocalStack(ephemeral(servers=2, sim_args=["--time-scale", "0.2"])) as s:
        yield s


@dataclass
class Terminal:
    """`epp top` on the child side of a pseudo-terminal (its controlling terminal, so
    Ctrl-C typed there interrupts it as in a real one)."""

    pid: int
    fd: int
    output: str = ""
    exit_status: int | None = field(default=None)

    def read(self, timeout: float) -> None:
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if ready:
            try:
                self.output += os.read(self.fd, 65536).decode(errors="replace")
            except OSError:  # EIO: the child side closed
                time.sleep(timeout)

    def rows(self) -> list[list[str]]:
        lines = ANSI.sub("", self.output).replace("\r", "\n").splitlines()
        return [line.split() for line in lines if re.match(r"\s*\d+\.\d+\.\d+\.\d+:\d+ ", line)]

    def wait_exit(self, timeout: float) -> int | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.read(0.1)
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.exit_status = os.waitstatus_to_exitcode(status)
                return self.exit_status
        return None


@pytest.fixture
def terminal(stack: LocalStack) -> Iterator[Terminal]:
    argv = [sys.executable, "-m", "epp", "top", "--url", stack.epp_http_url, "--interval", "0.5"]
    env = {**os.environ, "COLUMNS": "160", "LINES": "40", "TERM": "xterm-256color"}
    pid, fd = pty.fork()
    if pid == 0:  # the child: becomes `epp top`
        # as a shell gives a program it runs in a terminal: a test run started in the
        # background (SIGINT ignored, which children inherit) must not make Ctrl-C a no-op
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.execve(sys.executable, argv, env)
    term = Terminal(pid, fd)
    try:
        yield term
    finally:
        if term.exit_status is None and term.wait_exit(0) is None:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(fd)


def traffic(stack: LocalStack, stop: threading.Event) -> None:
    body = orjson.dumps(
        {"model": "sim-model", "prompt": "the same long prefix " * 40, "max_tokens": 2}
    )
    while not stop.is_set():
        request(f"{stack.envoy_url}/v1/completions", body, {"content-type": "application/json"})


def test_rows_and_rates_appear_and_q_quits(stack: LocalStack, terminal: Terminal) -> None:
    addresses = {url.removeprefix("http://") for url in stack.sim_urls}
    stop = threading.Event()
    sender = threading.Thread(target=traffic, args=(stack, stop), daemon=True)
    sender.start()
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            terminal.read(0.2)
            rows = terminal.rows()
            seen = {r[0] for r in rows}
            busy = [r for r in rows if r[REQ_S] != "-" and float(r[REQ_S]) > 0]
            hits = [r for r in rows if r[HIT] != "-"]  # the same prefix again and again
            if addresses <= seen and busy and hits:
                break
        else:
            pytest.fail(f"no rows with a rate; screen so far:\n{ANSI.sub('', terminal.output)}")
    finally:
        stop.set()
        sender.join(10)
    assert all(r[1] == "decode" and r[2] == "healthy" for r in rows if r[0] in addresses)
    assert "requests " in ANSI.sub("", terminal.output)
    os.write(terminal.fd, b"q")
    assert terminal.wait_exit(10) == 0
    assert "Traceback" not in terminal.output


def test_ctrl_c_quits_cleanly(terminal: Terminal) -> None:
    deadline = time.monotonic() + 20
    while "q or Ctrl-C quits" not in terminal.output and time.monotonic() < deadline:
        terminal.read(0.2)
    assert "q or Ctrl-C quits" in terminal.output
    os.write(terminal.fd, b"\x03")  # the terminal turns it into SIGINT
    assert terminal.wait_exit(10) == 0
    assert "Traceback" not in terminal.output
