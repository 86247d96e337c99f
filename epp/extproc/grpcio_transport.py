"""grpc.aio transport: carries each ext_proc stream through the driver
(:mod:`epp.extproc.driver`). Replies go out with ``context.write`` (not an async
generator's ``yield``), so that the driver can also send one while it waits for Envoy's
next message (a stalled response's end)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from functools import partial
from typing import TYPE_CHECKING, Any

import grpc
from envoy.service.discovery.v3.discovery_pb2 import DiscoveryRequest, DiscoveryResponse
from envoy.service.endpoint.v3 import eds_pb2_grpc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc
from envoy.service.ext_proc.v3.external_processor_pb2 import ProcessingRequest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from epp.common.health import HEALTH_SERVICES
from epp.extproc.driver import StreamBroken, drive
from epp.extproc.transport import MAX_MESSAGE_BYTES, max_destinations
from epp.router import Router
from epp.xds.eds import EdsServer

if TYPE_CHECKING:
    from epp.extproc.certreload import LiveCertificate
    from epp.extproc.tls import ServerTls


class ExtProcServicer(external_processor_pb2_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    def __init__(self, router: Router) -> None:
        self._router = router

    async def Process(
        self, request_iterator: AsyncIterator[ProcessingRequest], context: Any
    ) -> None:
        destinations = max_destinations(context.invocation_metadata() or ())
        try:
            # a half-close, or a reset: grpc.aio ends the request iterator alike for both
            await drive(_Channel(request_iterator, context), self._router, destinations, "ended")
        except StreamBroken as broken:  # the message broke the protocol
            context.set_code(grpc.StatusCode.FAILED_PRECONDITION)
            context.set_details(broken.reason)


class _Channel:
    """A grpc.aio stream as the driver's Channel: the request iterator's next message,
    ``context.write`` for replies (callable while a read is pending)."""

    __slots__ = ("recv", "send")

    def __init__(self, requests: AsyncIterator[ProcessingRequest], context: Any) -> None:
        self.recv = partial(anext, aiter(requests), None)
        self.send = context.write


class EdsServicer(eds_pb2_grpc.EndpointDiscoveryServiceServicer):  # type: ignore[misc]
    def __init__(self, eds: EdsServer) -> None:
        self._eds = eds

    async def StreamEndpoints(
        self, request_iterator: AsyncIterator[DiscoveryRequest], context: Any
    ) -> AsyncIterator[DiscoveryResponse]:
        async for response in self._eds.stream(request_iterator):
            yield response


class GrpcioTransport:
    def __init__(self, router: Router, eds: EdsServer | None = None) -> None:
        self._server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ]
        )
        external_processor_pb2_grpc.add_ExternalProcessorServicer_to_server(
            ExtProcServicer(router), self._server
        )
        if eds is not None:
            eds_pb2_grpc.add_EndpointDiscoveryServiceServicer_to_server(
                EdsServicer(eds), self._server
            )
        self._health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        self._health_server: grpc.aio.Server | None = None

    async def start(self, host: str, port: int, tls: LiveCertificate | None = None) -> int:
        address = f"{host}:{port}"
        try:
            if tls is None:
                bound: int = self._server.add_insecure_port(address)
            else:
                bound = self._server.add_secure_port(address, _credentials(tls))
        except RuntimeError as exc:
            raise OSError(f"gRPC port {host}:{port}: {exc}") from None
        await self._server.start()
        return bound

    async def start_health(self, host: str, port: int) -> int:
        self._health_server = grpc.aio.server()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._health_server)
        try:
            bound: int = self._health_server.add_insecure_port(f"{host}:{port}")
        except RuntimeError as exc:
            raise OSError(f"gRPC health port {host}:{port}: {exc}") from None
        await self._health_server.start()
        return bound

    async def set_serving(self, serving: bool, names: Iterable[str] = HEALTH_SERVICES) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in names:
            await self._health.set(name, status)

    async def stop(self, grace: float) -> None:
        await self._server.stop(grace)
        if self._health_server is not None:
            await self._health_server.stop(0)


def _credentials(live: LiveCertificate) -> grpc.ServerCredentials:
    """Credentials that ask ``live`` at each new connection whether the certificate
    changed (grpc calls the fetcher before a handshake; None: keep the current one)."""
    served = [live.generation]

    def config(tls: ServerTls) -> grpc.ServerCertificateConfiguration:
        return grpc.ssl_server_certificate_configuration([(tls.key_pem, tls.cert_pem)])

    def fetch() -> grpc.ServerCertificateConfiguration | None:
        if live.generation == served[0]:
            return None
        served[0] = live.generation
        return config(live.tls)

    return grpc.dynamic_ssl_server_credentials(config(live.tls), fetch)


def make(router: Router, eds: EdsServer | None = None) -> GrpcioTransport:
    return GrpcioTransport(router, eds)
