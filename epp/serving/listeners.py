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


class GrpcPorts:
    """The gRPC port (ext_proc, EDS, gRPC health, TLS when asked) and the plaintext gRPC
    health port, both served by ``transport``. ``port``, ``health_port``: as bound once
    started (0: any free one; ``health_port`` None: no health port of its own)."""

    def __init__(
        self,
        transport: Transport,
        host: str,
        port: int,
        *,
        health_port: int | None = None,
        tls: LiveCertificate | None = None,
        grace_s: float = 10.0,
    ) -> None:
        self._transport = transport
        self.host = host
        self.port = port
        self.health_port = health_port
        self._tls = tls
        self._grace_s = grace_s

    async def start(self) -> None:
        self.port = await self._transport.start(self.host, self.port, self._tls)
        if self.health_port is not None:
            try:
                self.health_port = await self._transport.start_health(self.host, self.health_port)
            except OSError:
                await self._transport.stop(0)
                raise
            log.info("gRPC health (plaintext) on %s:%d", self.host, self.health_port)

    async def stop(self, graceful: bool = True) -> None:
        """Open ext_proc streams get the grace to finish (``graceful``), else none."""
        await self._transport.stop(grace=self._grace_s if graceful else 0)


class HttpPort:
    """The HTTP admin port (TLS when asked); ``port``: as bound once started."""

    def __init__(
        self, admin: web.Application, host: str, port: int, tls: LiveCertificate | None = None
    ) -> None:
        self._runner = web.AppRunner(admin, access_log=None)
        self.host = host
        self.port = port
        self._tls = tls

    async def start(self) -> None:
        """OSError naming the port when it cannot be opened."""
        await self._runner.setup()
        context = None
        if self._tls is not None:
            from epp.extproc.tls import HTTP_ALPN

            context = self._tls.context(HTTP_ALPN)
        site = web.TCPSite(self._runner, self.host, self.port, ssl_context=context)
        try:
            await site.start()
        except OSError as exc:
            raise OSError(f"HTTP port {self.host}:{self.port}: {exc.strerror}") from None
        self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        await self._runner.cleanup()


class Listeners:
    """The gRPC ports (None: the parent of ``--workers``, whose workers hold them), then
    the HTTP port, opened in that order; ``on_listening(grpc, http)`` once they listen.
    Stopping turns readiness NOT_SERVING and ends the EDS streams first."""

    def __init__(
        self,
        grpc: GrpcPorts | None,
        http: HttpPort,
        health: HealthSetter,
        eds: EdsServer,
        on_listening: Callable[[int, int], None] = lambda grpc, http: None,
    ) -> None:
        self._grpc = grpc
        self._http = http
        self._health = health
        self._eds = eds
        self._on_listening = on_listening

    @property
    def grpc_port(self) -> int:
        """As bound (0: this process opens no gRPC port)."""
        return self._grpc.port if self._grpc is not None else 0

    @property
    def health_port(self) -> int | None:
        return self._grpc.health_port if self._grpc is not None else None

    @property
    def http_port(self) -> int:
        return self._http.port

    @property
    def ports(self) -> tuple[int, int, int | None]:
        """(gRPC, HTTP, health) as bound."""
        return self.grpc_port, self.http_port, self.health_port

    async def start(self) -> None:
        """Open the gRPC port, the health port, then the HTTP port; OSError naming the
        one that failed."""
        if self._grpc is not None:
            await self._grpc.start()
        try:
            await self._http.start()
        except OSError:
            if self._grpc is not None:
                await self._grpc.stop(graceful=False)
            raise
        self._on_listening(self.grpc_port, self.http_port)

    async def stop(self) -> None:
        """Readiness NOT_SERVING; EDS streams end (Envoy keeps the endpoints it has);
        open ext_proc streams get the grace to finish; then the HTTP port closes."""
        await self._health.set_serving(False)
        self._eds.close()
        if self._grpc is not None:
            await self._grpc.stop()
        await self._http.stop()
