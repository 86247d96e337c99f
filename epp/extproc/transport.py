"""The gRPC transport seam: any server that can carry ext_proc streams into
:class:`ExtProcStream` and answer the standard gRPC health service.

Two implementations, chosen with ``epp serve --transport``: ``grpclib`` (pure-Python
asyncio HTTP/2, the default: lower latency and ~15 % less EPP CPU per request than
grpc.aio at concurrency 1 in bench/results/overhead.md; at concurrency 64 the two are
within run-to-run noise) and ``grpcio`` (grpc.aio, Google's implementation). Each is
imported only when chosen, because both ship a generated ``grpc.health.v1`` module and
the two cannot share a process.
"""

from __future__ import annotations

import importlib
from typing import Protocol

from epp.router import Router

EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
# Health service names Envoy / Kubernetes probes ask for ("" = the whole server).
HEALTH_SERVICES = ("", "liveness", "readiness", EXT_PROC_SERVICE)
DEFAULT_TRANSPORT = "grpclib"
TRANSPORTS = {
    "grpcio": "epp.extproc.grpcio_transport",
    "grpclib": "epp.extproc.grpclib_transport",
}
# Largest gRPC message accepted either way; Envoy's body chunks are far smaller.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024


class Transport(Protocol):
    async def start(self, host: str, port: int) -> int:
        """Listen on host:port (0 = any free port) and return the bound port.
        Raises OSError naming the address if it cannot bind."""
        ...

    async def set_serving(self, serving: bool) -> None:
        """Report every name in HEALTH_SERVICES as SERVING or NOT_SERVING."""
        ...

    async def stop(self, grace: float) -> None:
        """Stop accepting streams; give open ones up to ``grace`` seconds."""
        ...


def make_transport(name: str, router: Router) -> Transport:
    module = importlib.import_module(TRANSPORTS[name])
    transport: Transport = module.make(router)
    return transport
