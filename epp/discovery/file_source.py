"""``epp serve --endpoints-file PATH``: the pool follows a file (format:
:mod:`epp.discovery.endpoints_file`), without Kubernetes and without a restart.

At start the file must exist and be valid, or the EPP does not start. Then every
``poll_s`` seconds the file is looked at (one ``stat``): when its modification time,
size or inode changed it is read, and when its content changed (SHA-256) and reads the
same again ``SETTLE_S`` later (a writer in mid-write is not applied), it is parsed. A
valid list is applied as the difference from the last one applied
(:mod:`epp.discovery.membership_diff`): new addresses join, changed ones take their new
role, labels and engine, and dropped ones drain -- the datastore's remove, as the admin
API's: they get no new requests and leave when their requests in flight end. A file that
does not parse, or is gone, is logged with the reason (once per problem) and the last
good list stays; when the file is valid again it is applied.

The file owns the addresses it lists; it touches nothing else. Servers named by flags
or the config's ``endpoints`` are added first, so an address both there and in the file
becomes the file's. The admin API still acts on any member (one address is one member,
docs/architecture.md); the file re-asserts an entry only when that entry changes.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import logging
from pathlib import Path

from epp.common import argtypes, looptask
from epp.datastore import Datastore
from epp.discovery.endpoints_file import EndpointsFileError, parse
from epp.discovery.membership_diff import apply, diff
from epp.types import Endpoint

log = logging.getLogger(__name__)

DEFAULT_POLL_S = 1.0
SETTLE_S = 0.1  # a changed file must read the same this much later to be applied

Stamp = tuple[int, int, int]  # (mtime ns, size, inode)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group(
        "endpoints file", "see docs/operations.md, Endpoints from a watched file"
    )
    g.add_argument(
        "--endpoints-file",
        type=Path,
        metavar="PATH",
        help="follow the model servers this file lists (YAML or JSON, the llm-d Router's "
        "file-discovery format): edits apply without a restart; removed servers drain",
    )
    g.add_argument(
        "--endpoints-file-poll-seconds",
        type=argtypes.non_negative_float,
        default=DEFAULT_POLL_S,
        metavar="SECONDS",
        help="how often the --endpoints-file is checked for changes (0: read once at start)",
    )


class FileSource:
    """The discovery source of ``--endpoints-file``."""

    def __init__(
        self, path: Path, datastore: Datastore, *, poll_s: float = DEFAULT_POLL_S, engine: str
    ) -> None:
        self.path = path
        self.poll_s = poll_s
        self._datastore = datastore
        self._engine = engine
        self.applied: dict[str, Endpoint] = {}  # the last good list, by address
        self._stamp: Stamp | None = None
        self._digest = b""  # of the content last read
        self._problem = ""  # the last problem logged (each is logged once)
        self._loop = looptask.every(f"checking endpoints file {path}", poll_s, self.check, log)

    async def start(self) -> None:
        """Apply the file; OSError (naming the file and the problem) if it cannot be
        read or is not valid."""
        try:
            self._stamp = self._stat()
            text = self.path.read_text()
            endpoints = parse(text, str(self.path), self._engine)
        except OSError as exc:
            raise OSError(f"--endpoints-file {self.path}: {exc.strerror or exc}") from None
        except (EndpointsFileError, UnicodeDecodeError) as exc:
            raise OSError(f"--endpoints-file {exc}") from None
        self._digest = _digest(text)
        self._apply(endpoints)
        if self.poll_s > 0:
            self._loop.start()

    async def stop(self) -> None:
        """Stop watching; the endpoints stay (the process is ending)."""
        await self._loop.stop()

    async def check(self) -> bool:
        """Look at the file once; apply it if it changed and is valid. True if a new
        list was applied."""
        try:
            stamp = self._stat()
            if stamp == self._stamp:
                return False
            text = self.path.read_text()
            if _digest(text) == self._digest:
                self._stamp = stamp  # touched, not changed
                return False
            await asyncio.sleep(SETTLE_S)
            if self.path.read_text() != text:
                return False  # still being written: next round
        except OSError as exc:
            self._stamp, self._digest = None, b""  # whatever comes back is parsed
            return self._report(f"{exc.strerror or exc}")
        except UnicodeDecodeError as exc:
            self._stamp = stamp
            return self._report(f"not UTF-8 text ({exc.reason} at byte {exc.start})")
        self._stamp, self._digest = stamp, _digest(text)
        try:
            endpoints = parse(text, str(self.path), self._engine)
        except EndpointsFileError as exc:
            return self._report(str(exc).removeprefix(f"{self.path}: "))
        self._problem = ""
        return self._apply(endpoints)

    def _apply(self, endpoints: tuple[Endpoint, ...]) -> bool:
        wanted = {e.address: e for e in endpoints}
        change = diff(self.applied, wanted)
        apply(self._datastore, change)
        self.applied = wanted
        log.info("endpoints file %s: %d endpoint(s) (%s)", self.path, len(wanted), change.summary())
        return bool(change)

    def _report(self, problem: str) -> bool:
        if problem != self._problem:
            self._problem = problem
            log.error(
                "endpoints file %s: %s; keeping the last good list (%d endpoint(s))",
                self.path,
                problem,
                len(self.applied),
            )
        return False

    def _stat(self) -> Stamp:
        st = self.path.stat()
        return st.st_mtime_ns, st.st_size, st.st_ino


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()
