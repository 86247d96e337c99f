"""The EPP's ports as one component: the gRPC port (ext_proc, EDS, gRPC health), the
plaintext gRPC health port (kubelet's gRPC probes, as the llm-d Router chart sets
them) and the HTTP admin port (TLS too when asked), opened in that order and closed
gracefully. The parent of ``--workers`` opens only the HTTP port (its workers hold the
gRPC ones)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from aiohttp import web

from epp.common.health import HealthSetter
from epp.extproc.transport import Transport
from epp.xds.eds import EdsServer

if TYPE_CHECKING:
    from epp.extproc.certreload import LiveCertificate

log = logging.getLogger(__name__)


class Listeners:
    def __init__(
        self,
        transport: Transport,
        eds: EdsServer,
        health: HealthSetter,
        admin: web.Application,
        *,
        host: str,
        grpc_port: int,
        http_port: int,
        health_port: int | None = None,
        tls: LiveCertificate | None = None,
        http_tls: LiveCertificate | None = None,
        grace_s: float = 10.0,
        grpc: bool = True,
        http_host: str | None = None,
        on_listening: Callable[[int, int], None] = lambda grpc, http: None,
    ) -> None:
        self._transport = transport
        self._eds = eds
        self._health = health
        self._runner = web.AppRunner(admin, access_log=None)
        self.host = host
        self.grpc_port = grpc_port  # the bound ports once started (0 = any free one)
        self.http_port = http_port
        self.health_port = health_port  # None: no health port of its own
        self._tls = tls
        self._http_tls = http_tls
        self._grace_s = grace_s
        self._on_listening = on_listening
        self._grpc = grpc  # False: the HTTP port only (grpc_port stays as given)
        self._http_host = host if http_host is None else http_host

    @property
    def ports(self) -> tuple[int, int, int | None]:
        """(gRPC, HTTP, health) as bound."""
        return self.grpc_port, self.http_port, self.health_port

    async def start(self) -> None:
        """Open the gRPC port, the health port, then the HTTP port; OSError naming the
        one that failed."""
        if self._grpc:
            await self._start_grpc()
        await self._runner.setup()
        context = None
        if self._http_tls is not None:
            from epp.extproc.tls import HTTP_ALPN

            context = self._http_tls.context(HTTP_ALPN)
        site = web.TCPSite(self._runner, self._http_host, self.http_port, ssl_context=context)
        try:
            await site.start()
        except OSError as exc:
            if self._grpc:
                await self._transport.stop(0)
            raise OSError(f"HTTP port {self._http_host}:{self.http_port}: {exc.strerror}") from None
        self.http_port = self._runner.addresses[0][1]
        self._on_listening(self.grpc_port, self.http_port)

    async def _start_grpc(self) -> None:
        self.grpc_port = await self._transport.start(self.host, self.grpc_port, self._tls)
        if self.health_port is not None:
            try:
                self.health_port = await self._transport.start_health(self.host, self.health_port)
            except OSError:
                await self._transport.stop(0)
                raise
            log.info("gRPC health (plaintext) on %s:%d", self.host, self.health_port)

    async def stop(self) -> None:
        """Readiness NOT_SERVING; EDS streams end (Envoy keeps the endpoints it has);
        open ext_proc streams get the grace to finish; then the HTTP port closes."""
        await self._health.set_serving(False)
        self._eds.close()
        if self._grpc:
            await self._transport.stop(grace=self._grace_s)
        await self._runner.cleanup()
