"""The gRPC transport seam: any server that can carry ext_proc streams (each one a
:class:`~epp.extproc.driver.Channel` handed to :func:`~epp.extproc.driver.drive`) and
answer the standard gRPC health service.

Three implementations, chosen with ``epp serve --transport``: ``grpclib`` (pure-Python
asyncio HTTP/2, the default: as little or less EPP CPU per 1 KB request than grpc.aio
in bench/results/overhead.md), ``grpcio`` (grpc.aio, Google's implementation, whose
C core frames HTTP/2: ~10-20 % less EPP CPU per 220 KB request in
bench/results/overhead-220kb.md) and ``native`` (:mod:`epp.extproc.native`: HTTP/2 and
gRPC framing written for this one peer; new, not measured yet). Each is imported only
when chosen, because grpcio and grpclib both ship a generated ``grpc.health.v1`` module
and the two cannot share a process (``native`` codes its two health messages itself).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol

from epp.common.health import HEALTH_SERVICES
from epp.router import Router
from epp.xds.eds import EdsServer

if TYPE_CHECKING:
    from epp.extproc.certreload import LiveCertificate

DEFAULT_TRANSPORT = "grpclib"
TRANSPORTS = {
    "grpcio": "epp.extproc.grpcio_transport",
    "grpclib": "epp.extproc.grpclib_transport",
    # this project's own HTTP/2 and gRPC framing (epp/extproc/native/): new, not yet the
    # default (docs/operations.md)
    "native": "epp.extproc.native.server",
}
# gRPC metadata by which an Envoy config says how long a destination list it can use
MAX_DESTINATIONS_METADATA = "x-epp-max-destinations"
# Largest gRPC message accepted either way; Envoy's body chunks are far smaller.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024


class Transport(Protocol):
    async def start(self, host: str, port: int, tls: LiveCertificate | None = None) -> int:
        """Listen on host:port (0 = any free port), over TLS when ``tls`` is given (its
        newest certificate at each handshake), and return the bound port. Raises
        OSError naming the address if it cannot bind."""
        ...

    async def start_health(self, host: str, port: int) -> int:
        """Also answer gRPC health, alone and in plaintext, on host:port (0 = any free
        port); return the bound port. Raises OSError naming the address. Stopped by
        :meth:`stop`."""
        ...

    async def set_serving(self, serving: bool, names: Iterable[str] = HEALTH_SERVICES) -> None:
        """Report ``names`` (default: all of HEALTH_SERVICES) as SERVING or NOT_SERVING."""
        ...

    async def stop(self, grace: float) -> None:
        """Stop accepting streams; give open ones up to ``grace`` seconds."""
        ...


def make_transport(name: str, router: Router, eds: EdsServer | None = None) -> Transport:
    """The named transport serving ext_proc, gRPC health and, when given, EDS."""
    module = importlib.import_module(TRANSPORTS[name])
    transport: Transport = module.make(router, eds)
    return transport


def max_destinations(metadata: Iterable[tuple[str, str | bytes]]) -> int:
    """How many ``ip:port`` the Envoy config on this stream can use, from the gRPC
    metadata it sends (``x-epp-max-destinations``, set by configs whose cluster reads
    fallback lists). Without it, one: ``ORIGINAL_DST`` cannot parse a list."""
    for key, value in metadata:
        if key == MAX_DESTINATIONS_METADATA:
            text = value.decode() if isinstance(value, bytes) else value
            return int(text) if text.isdigit() and int(text) > 0 else 1
    return 1
