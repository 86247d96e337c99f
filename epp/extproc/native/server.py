"""The ``native`` transport: ext_proc, gRPC health and EDS on this package's own HTTP/2
and gRPC framing (asyncio Protocols, no general-purpose HTTP/2 library). Each ext_proc
stream is a :class:`~epp.extproc.native.grpc.Call`, which is the driver's Channel."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable
from typing import TYPE_CHECKING, Any

from envoy.service.discovery.v3.discovery_pb2 import DiscoveryRequest
from envoy.service.ext_proc.v3.external_processor_pb2 import ProcessingRequest

from epp.common.health import EXT_PROC_SERVICE, HEALTH_SERVICES
from epp.extproc.driver import StreamBroken, drive
from epp.extproc.native.connection import Connection
from epp.extproc.native.grpc import FAILED_PRECONDITION, Call, GrpcError, GrpcServer, Method
from epp.extproc.native.health import Health
from epp.extproc.transport import MAX_MESSAGE_BYTES, max_destinations
from epp.router import Router
from epp.xds.eds import EDS_SERVICE, EdsServer

if TYPE_CHECKING:
    from epp.extproc.certreload import LiveCertificate

# a health request is a service name
_HEALTH_MESSAGE_BYTES = 64 * 1024


class NativeTransport:
    def __init__(self, router: Router, eds: EdsServer | None = None) -> None:
        self._router = router
        self._eds = eds
        self._health = Health()
        methods = {
            f"/{EXT_PROC_SERVICE}/Process": Method(ProcessingRequest.FromString, self._process),
            **self._health.methods(),
        }
        if eds is not None:
            methods[f"/{EDS_SERVICE}/StreamEndpoints"] = Method(
                DiscoveryRequest.FromString, self._eds_stream
            )
        self._grpc = GrpcServer(methods, MAX_MESSAGE_BYTES)
        self._health_grpc = GrpcServer(self._health.methods(), _HEALTH_MESSAGE_BYTES)
        self._servers: list[asyncio.Server] = []
        self._connections: set[Connection] = set()

    async def start(self, host: str, port: int, tls: LiveCertificate | None = None) -> int:
        context = None
        if tls is not None:
            from epp.extproc.tls import GRPC_ALPN

            context = tls.context(GRPC_ALPN)
        return await self._listen(self._grpc, host, port, context, "gRPC port")

    async def start_health(self, host: str, port: int) -> int:
        return await self._listen(self._health_grpc, host, port, None, "gRPC health port")

    async def _listen(self, grpc: GrpcServer, host: str, port: int, context: Any, what: str) -> int:
        def connection() -> Connection:
            conn = Connection(grpc.open_stream, self._connections.discard)
            self._connections.add(conn)
            return conn

        loop = asyncio.get_running_loop()
        try:
            server = await loop.create_server(connection, host, port, ssl=context)
        except OSError as exc:
            raise OSError(f"{what} {host}:{port}: {exc.strerror}") from None
        self._servers.append(server)
        bound: int = server.sockets[0].getsockname()[1]
        return bound

    @property
    def open_calls(self) -> int:
        """gRPC calls whose handlers are running (ext_proc, EDS, health)."""
        return len(self._grpc.calls) + len(self._health_grpc.calls)

    async def set_serving(self, serving: bool, names: Iterable[str] = HEALTH_SERVICES) -> None:
        self._health.set(serving, names)

    async def stop(self, grace: float) -> None:
        """Listen no more; each connection gets a GOAWAY and closes once its streams are
        done, within ``grace`` seconds; then what is left is reset and its handlers
        are awaited (they release what their requests hold)."""
        for server in self._servers:
            server.close()
        self._health.close()
        connections = list(self._connections)
        for conn in connections:
            conn.drain()
        if connections:
            closed = asyncio.gather(*(conn.closed.wait() for conn in connections))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(closed, grace)
        for conn in list(self._connections):
            conn.abort()
        tasks = [
            call.task
            for call in (*self._grpc.calls, *self._health_grpc.calls)
            if call.task is not None
        ]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for server in self._servers:
            await server.wait_closed()

    async def _process(self, call: Call[ProcessingRequest]) -> None:
        try:
            await drive(call, self._router, max_destinations(call.metadata))
        except StreamBroken as exc:
            raise GrpcError(FAILED_PRECONDITION, exc.reason) from None

    async def _eds_stream(self, call: Call[DiscoveryRequest]) -> None:
        assert self._eds is not None
        async for response in self._eds.stream(_requests(call)):
            await call.send(response)


async def _requests(call: Call[DiscoveryRequest]) -> AsyncIterator[DiscoveryRequest]:
    while (request := await call.recv()) is not None:
        yield request


def make(router: Router, eds: EdsServer | None = None) -> NativeTransport:
    return NativeTransport(router, eds)
