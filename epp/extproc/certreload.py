"""Certificates that follow their files: when the certificate or key file of a port
changes on disk (a renewed Kubernetes secret, cert-manager), the port serves the new
pair from its next TLS handshake on, with no restart. Connections already open keep
the certificate they were made with.

:class:`LiveCertificate` is what a port serves now and every TLS context built from it;
:class:`CertReloader` checks the files of each every few seconds (a ``stat``, as
:mod:`epp.serving.reload` does for the config) and, when they changed, reads and checks the
new pair first: a pair that cannot be used (unreadable, not PEM, a key that does not
match) is logged as an error and the port keeps its current certificate. Self-signed
certificates have no files and never change.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Iterable
from pathlib import Path

from epp.common.looptask import LoopTask
from epp.extproc.tls import ServerTls, TlsError, load_files, load_into, server_context

log = logging.getLogger("epp.tls")

DEFAULT_POLL_S = 2.0
SETTLE_S = 0.2  # after a change is seen: both files of a pair are rarely written at once

Stamp = tuple[tuple[int, int, int], ...] | None  # (mtime ns, size, inode) per file


class LiveCertificate:
    """The certificate a port serves now (``tls``), counted by ``generation`` (grpcio
    asks for it per handshake), and the ``ssl`` contexts built from it (grpclib,
    aiohttp), which :meth:`replace` loads the new pair into."""

    def __init__(self, tls: ServerTls) -> None:
        self.tls = tls
        self.generation = 0
        self._contexts: list[ssl.SSLContext] = []
        self.stamp: Stamp = _stamp(tls.files)

    def context(self, alpn: tuple[str, ...]) -> ssl.SSLContext:
        """A server context serving this certificate, kept up to date by :meth:`replace`."""
        context = server_context(self.tls, alpn)
        self._contexts.append(context)
        return context

    def replace(self, tls: ServerTls) -> None:
        for context in self._contexts:
            load_into(context, tls)
        self.tls = tls
        self.generation += 1


def live_pair(
    grpc: ServerTls | None, http: ServerTls | None
) -> tuple[LiveCertificate | None, LiveCertificate | None]:
    """What the gRPC and the HTTP port serve; one object when ``http is grpc``
    (``--http-tls``: the same certificate, reloaded once for both)."""
    grpc_live = LiveCertificate(grpc) if grpc is not None else None
    if http is None:
        return grpc_live, None
    return grpc_live, grpc_live if http is grpc else LiveCertificate(http)


class CertReloader:
    """Polls the files of each certificate every ``poll_s`` seconds (0: never)."""

    def __init__(
        self, certificates: Iterable[LiveCertificate | None], poll_s: float = DEFAULT_POLL_S
    ) -> None:
        unique = dict.fromkeys(c for c in certificates if c is not None)
        self._certificates = [c for c in unique if c.tls.files is not None]
        self._poll_s = poll_s
        self._task = LoopTask("tls-reload", self._loop)

    async def start(self) -> None:
        if self._certificates and self._poll_s > 0:
            self._task.start()

    async def stop(self) -> None:
        await self._task.stop()

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._poll_s)
            if any(_stamp(c.tls.files) != c.stamp for c in self._certificates):
                await asyncio.sleep(SETTLE_S)
                self.check()

    def check(self) -> None:
        """Reload each certificate whose files changed since last read (or tried)."""
        for live in self._certificates:
            files = live.tls.files
            assert files is not None
            stamp = _stamp(files)
            if stamp == live.stamp:
                continue
            live.stamp = stamp  # a bad pair is reported once, not at every poll
            try:
                new = load_files(*files)
            except TlsError as exc:
                log.error("TLS certificate not reloaded, still serving the previous one: %s", exc)
                continue
            live.replace(new)
            log.info("TLS certificate reloaded from %s", new.source)


def _stamp(files: tuple[Path, Path] | None) -> Stamp:
    if files is None:
        return None
    stamps = []
    for path in files:
        try:
            st = path.stat()  # follows symlinks: a Kubernetes secret volume swaps them
        except OSError:
            stamps.append((0, -1, 0))  # gone (mid-swap): a change, read and reported
            continue
        stamps.append((st.st_mtime_ns, st.st_size, st.st_ino))
    return tuple(stamps)
