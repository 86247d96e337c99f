"""The EPP's health statuses (``liveness``, ``readiness``, ...), set once and seen both by
the gRPC health service and by the HTTP port's ``/ready``: kubelet's gRPC probes cannot
speak TLS, so an EPP serving its gRPC port over TLS is probed over HTTP instead.

The service names live here, at the bottom of the layers, so that what sets a status
(discovery, ``serve``) and what answers probes (the gRPC transports) share them."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Protocol

EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
# Health service names Envoy / Kubernetes probes ask for ("" = the whole server).
LIVENESS = "liveness"
READINESS = "readiness"
# what the llm-d Router chart's probes ask for with one replica (readiness's meaning)
INFERENCE_EXTENSION = "inference-extension"
HEALTH_SERVICES = ("", LIVENESS, READINESS, EXT_PROC_SERVICE, INFERENCE_EXTENSION)


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


class ReadinessGate:
    """Readiness as the discovery sources allow it: SERVING while none holds it back
    (one that lists its endpoints asynchronously holds it until its first full list);
    liveness is always SERVING."""

    def __init__(self, health: HealthSetter) -> None:
        self._health = health
        self._held: set[str] = set()

    def hold(self, holder: str) -> Callable[[bool], Awaitable[None]]:
        """Hold readiness back for ``holder`` (from the first :meth:`publish`); returns
        how it says it is ready (True) or not again (False)."""
        self._held.add(holder)

        async def report(ready: bool) -> None:
            if ready:
                self._held.discard(holder)
            else:
                self._held.add(holder)
            await self.publish()

        return report

    async def publish(self) -> None:
        await self._health.set_serving(not self._held)
        await self._health.set_serving(True, [LIVENESS])
