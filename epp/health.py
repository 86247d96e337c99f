"""The EPP's health statuses (``liveness``, ``readiness``, ...), set once and seen both by
the gRPC health service and by the HTTP port's ``/ready``: kubelet's gRPC probes cannot
speak TLS, so an EPP serving its gRPC port over TLS is probed over HTTP instead.

The service names live here, at the bottom of the layers, so that what sets a status
(discovery, ``serve``) and what answers probes (the gRPC transports) share them."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
# Health service names Envoy / Kubernetes probes ask for ("" = the whole server).
LIVENESS = "liveness"
READINESS = "readiness"
HEALTH_SERVICES = ("", LIVENESS, READINESS, EXT_PROC_SERVICE)


class HealthSetter(Protocol):
    async def set_serving(self, serving: bool, names: Iterable[str] = HEALTH_SERVICES) -> None:
        """Report ``names`` as SERVING or NOT_SERVING."""
        ...


class HealthBoard:
    """Forwards every status to the gRPC transport and remembers it for HTTP."""

    def __init__(self, transport: HealthSetter) -> None:
        self._transport = transport
        self._serving: dict[str, bool] = {}

    async def set_serving(self, serving: bool, names: Iterable[str] = HEALTH_SERVICES) -> None:
        names = tuple(names)
        await self._transport.set_serving(serving, names)  # HTTP follows once gRPC has
        for name in names:
            self._serving[name] = serving

    def serving(self, name: str = READINESS) -> bool:
        return self._serving.get(name, False)
