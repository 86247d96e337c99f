"""``epp top``: a live terminal view of a running EPP, read from its HTTP port
(``/status`` and ``/metrics``) every ``--interval`` seconds and redrawn in place; ``q``
or Ctrl-C quits. ``--once`` prints one frame (two samples an interval apart) and exits,
for scripts. docs/top.md shows a screen."""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import ssl
import sys
import termios
import time
import tty
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console
from rich.live import Live

from epp.common import argtypes
from epp.errors import InternalError
from epp.top.frame import Frame, Sample, frame, parse_exposition
from epp.top.render import render

DEFAULT_URL = "http://127.0.0.1:9090"
QUIT_KEYS = ("q", "Q")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url",
        type=argtypes.http_url,
        default=DEFAULT_URL,
        metavar="[http[s]://]HOST:PORT",
        help="the EPP's HTTP port (`epp serve --http-port`); https:// when it serves TLS "
        "(no scheme: http://)",
    )
    parser.add_argument(
        "--interval",
        type=argtypes.positive_float,
        default=2.0,
        metavar="SECONDS",
        help="time between two refreshes (rates are taken over it)",
    )
    parser.add_argument(
        "--once",
        action="store_true",
        help="print one frame (two samples --interval apart) and exit",
    )
    parser.add_argument(
        "--token-file",
        type=Path,
        metavar="PATH",
        help="a bearer token sent with each request (for `epp serve --metrics-endpoint-"
        "auth`, e.g. a service account token)",
    )
    parser.add_argument(
        "--cacert",
        type=Path,
        metavar="PATH",
        help="PEM certificates to verify an https:// EPP with (default: the system's)",
    )
    parser.add_argument(
        "--insecure",
        action="store_true",
        help="do not verify an https:// EPP's certificate (a self-signed one)",
    )
    parser.add_argument(
        "--timeout",
        type=argtypes.positive_float,
        default=5.0,
        metavar="SECONDS",
        help="how long one request to the EPP may take",
    )


class FetchError(InternalError):
    """The EPP could not be read; the message says what and why."""


class Client:
    def __init__(self, args: argparse.Namespace) -> None:
        self.url = args.url.rstrip("/")
        self._timeout = args.timeout
        self._headers = {}
        if args.token_file is not None:
            token = args.token_file.read_text().strip()
            self._headers["Authorization"] = f"Bearer {token}"
        self._ssl: ssl.SSLContext | None = None
        if self.url.startswith("https://"):
            self._ssl = ssl.create_default_context(
                cafile=str(args.cacert) if args.cacert is not None else None
            )
            if args.insecure:
                self._ssl.check_hostname = False
                self._ssl.verify_mode = ssl.CERT_NONE

    def sample(self) -> Sample:
        status = orjson.loads(self._get("/status"))
        metrics = self._get("/metrics").decode()
        try:
            series = parse_exposition(metrics)
        except ValueError as exc:
            raise FetchError(f"{self.url}/metrics: not Prometheus text ({exc})") from None
        return Sample(time.monotonic(), status, series)

    def _get(self, path: str) -> bytes:
        request = urllib.request.Request(self.url + path, headers=self._headers)
        try:
            with urllib.request.urlopen(request, timeout=self._timeout, context=self._ssl) as r:
                body: bytes = r.read()
                return body
        except urllib.error.HTTPError as exc:
            raise FetchError(f"{self.url}{path}: HTTP {exc.code} {exc.reason}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise FetchError(f"{self.url}{path}: {reason}") from None


def run(args: argparse.Namespace) -> int:
    try:
        client = Client(args)
    except OSError as exc:
        print(f"epp top: {exc}", file=sys.stderr)
        return 2
    try:
        first = client.sample()
    except (FetchError, orjson.JSONDecodeError) as exc:
        print(f"epp top: {exc}", file=sys.stderr)
        return 1
    console = Console()
    if args.once:
        time.sleep(args.interval)
        try:
            second = client.sample()
        except (FetchError, orjson.JSONDecodeError) as exc:
            print(f"epp top: {exc}", file=sys.stderr)
            return 1
        console.print(render(frame(first, second), client.url))
        return 0
    with contextlib.suppress(KeyboardInterrupt):
        _live(console, client, first, args.interval)
    return 0


def _live(console: Console, client: Client, first: Sample, interval: float) -> None:
    keys = "q or Ctrl-C quits"
    previous: Sample = first
    shown: Frame = frame(None, first)
    with _keypresses() as pressed, Live(console=console, auto_refresh=False) as live:
        note = keys
        while True:
            live.update(render(shown, client.url, note), refresh=True)
            if pressed(interval):
                return
            try:
                current = client.sample()
            except (FetchError, orjson.JSONDecodeError) as exc:
                note = f"{keys}; last refresh failed: {exc}"
                continue
            shown = frame(previous, current)
            previous, note = current, keys


@contextlib.contextmanager
def _keypresses() -> Iterator[Any]:
    """A function that waits up to its argument in seconds and says whether a quit key
    was pressed meanwhile; the terminal reads keys one by one (Ctrl-C still interrupts)
    until the block ends. Without a terminal on stdin it only waits."""
    fd = sys.stdin.fileno() if sys.stdin is not None and sys.stdin.isatty() else None
    if fd is None:

        def sleep(timeout: float) -> bool:
            time.sleep(timeout)
            return False

        yield sleep
        return
    saved = termios.tcgetattr(fd)
    tty.setcbreak(fd)

    def wait(timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select([fd], [], [], left)
            if ready and os.read(fd, 1).decode(errors="replace") in QUIT_KEYS:
                return True
        return False

    try:
        yield wait
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
