"""grpclib transport: pure-Python asyncio HTTP/2. Fewer layers per message than grpc.aio,
so less CPU per ext_proc message (see bench/results/overhead.md)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable
from typing import TYPE_CHECKING, Any

from envoy.service.discovery.v3.discovery_pb2 import DiscoveryRequest, DiscoveryResponse
from envoy.service.ext_proc.v3.external_processor_pb2 import ProcessingRequest, ProcessingResponse
from grpclib.const import Cardinality, Handler, Status
from grpclib.exceptions import GRPCError
from grpclib.health.v1.health_pb2 import HealthCheckRequest, HealthCheckResponse
from grpclib.server import Server, Stream

from epp.common.health import EXT_PROC_SERVICE, HEALTH_SERVICES
from epp.extproc.driver import StreamBroken, drive
from epp.extproc.h2frames import skip_hex_dumps_of_received_data
from epp.extproc.transport import max_destinations
from epp.router import Router
from epp.xds.eds import EDS_SERVICE, EdsServer

if TYPE_CHECKING:
    from epp.extproc.certreload import LiveCertificate


class _ExtProc:
    def __init__(self, router: Router) -> None:
        self._router = router
        self.active = 0  # open streams, for a graceful stop
        self.idle = asyncio.Event()
        self.idle.set()

    def __mapping__(self) -> dict[str, Handler]:
        return {
            f"/{EXT_PROC_SERVICE}/Process": Handler(
                self._process, Cardinality.STREAM_STREAM, ProcessingRequest, ProcessingResponse
            )
        }

    async def _process(self, stream: Stream[ProcessingRequest, ProcessingResponse]) -> None:
        destinations = max_destinations((stream.metadata or {}).items())
        self.active += 1
        self.idle.clear()
        try:
            await drive(_Channel(stream), self._router, destinations)
        except StreamBroken as broken:  # the message broke the protocol
            raise GRPCError(Status.FAILED_PRECONDITION, broken.reason) from None
        finally:
            self.active -= 1
            if not self.active:
                self.idle.set()


class _Channel:
    """A grpclib stream as the driver's Channel (its own methods, no wrapper frame)."""

    __slots__ = ("recv", "send")

    def __init__(self, stream: Stream[ProcessingRequest, ProcessingResponse]) -> None:
        self.recv = stream.recv_message
        self.send = stream.send_message


class _Eds:
    def __init__(self, eds: EdsServer) -> None:
        self._eds = eds

    def __mapping__(self) -> dict[str, Handler]:
        return {
            f"/{EDS_SERVICE}/StreamEndpoints": Handler(
                self._stream, Cardinality.STREAM_STREAM, DiscoveryRequest, DiscoveryResponse
            )
        }

    async def _stream(self, stream: Stream[DiscoveryRequest, DiscoveryResponse]) -> None:
        async for response in self._eds.stream(_received(stream)):
            await stream.send_message(response)


async def _received(
    stream: Stream[DiscoveryRequest, DiscoveryResponse],
) -> AsyncIterator[DiscoveryRequest]:
    async for request in stream:
        yield request


class _Health:
    """grpc.health.v1.Health/Check over a plain status table."""

    def __init__(self) -> None:
        self.status: dict[str, Any] = {}

    def __mapping__(self) -> dict[str, Handler]:
        return {
            "/grpc.health.v1.Health/Check": Handler(
                self._check, Cardinality.UNARY_UNARY, HealthCheckRequest, HealthCheckResponse
            )
        }

    async def _check(self, stream: Stream[HealthCheckRequest, HealthCheckResponse]) -> None:
        request = await stream.recv_message()
        assert request is not None
        status = self.status.get(request.service)
        if status is None:
            raise GRPCError(Status.NOT_FOUND, f"unknown service {request.service!r}")
        await stream.send_message(HealthCheckResponse(status=status))


class GrpclibTransport:
    def __init__(self, router: Router, eds: EdsServer | None = None) -> None:
        skip_hex_dumps_of_received_data()
        self._health = _Health()
        self._ext_proc = _ExtProc(router)
        handlers: list[Any] = [self._ext_proc, self._health]
        if eds is not None:
            handlers.append(_Eds(eds))
        self._server = Server(handlers)
        self._health_server: Server | None = None

    async def start(self, host: str, port: int, tls: LiveCertificate | None = None) -> int:
        context = None
        if tls is not None:
            from epp.extproc.tls import GRPC_ALPN

            context = tls.context(GRPC_ALPN)
        try:
            await self._server.start(host, port, ssl=context)
        except OSError as exc:
            raise OSError(f"gRPC port {host}:{port}: {exc.strerror}") from None
        # grpclib exposes no bound address; the asyncio server underneath has it.
        server: Any = self._server._server
        bound: int = server.sockets[0].getsockname()[1]
        return bound

    async def start_health(self, host: str, port: int) -> int:
        self._health_server = Server([self._health])
        try:
            await self._health_server.start(host, port)
        except OSError as exc:
            raise OSError(f"gRPC health port {host}:{port}: {exc.strerror}") from None
        server: Any = self._health_server._server
        bound: int = server.sockets[0].getsockname()[1]
        return bound

    async def set_serving(self, serving: bool, names: Iterable[str] = HEALTH_SERVICES) -> None:
        status = HealthCheckResponse.SERVING if serving else HealthCheckResponse.NOT_SERVING
        for name in names:
            self._health.status[name] = status

    async def stop(self, grace: float) -> None:
        # grpclib's close() cancels running streams at once, so first stop listening and
        # let open streams finish (up to ``grace``); only then close what is left.
        listener: Any = self._server._server
        if listener is not None:
            listener.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._ext_proc.idle.wait(), grace)
        self._server.close()
        await self._server.wait_closed()
        if self._health_server is not None:
            self._health_server.close()
            await self._health_server.wait_closed()


def make(router: Router, eds: EdsServer | None = None) -> GrpclibTransport:
    return GrpclibTransport(router, eds)
