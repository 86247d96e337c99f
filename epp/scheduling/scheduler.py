"""The configured scheduler: subset hint -> admission -> profile -> targets."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from epp.errors import NoEndpointError, ShedError
from epp.scheduling.base import CycleContext, RoutingObserver
from epp.scheduling.profile import Profile
from epp.scheduling.saturation import (
    AdmissionConfig,
    SaturationConfig,
    pool_saturated,
    request_priority,
)
from epp.types import InferenceRequest, SchedulingResult, Snapshot


@dataclass
class ProfileScheduler:
    """Runs the primary profile for every request (the single-profile handler; the P/D
    handler adds a prefill profile). Pure except for plugins' routing observers, which
    the router calls after a request is routed."""

    profiles: Mapping[str, Profile]
    primary: str
    saturation: SaturationConfig
    admission: AdmissionConfig
    stale_after_s: float
    clock: Callable[[], float]
    observers: Sequence[RoutingObserver] = ()

    def schedule(
        self, request: InferenceRequest, snapshot: Snapshot, rng: random.Random
    ) -> SchedulingResult:
        ctx = CycleContext(request, snapshot, self.clock(), rng, self.stale_after_s)
        candidates = snapshot.endpoints
        if request.subset is not None:
            candidates = tuple(s for s in candidates if s.address in request.subset)
            if not candidates:
                raise NoEndpointError(
                    "no endpoint of the proxy's subset hint "
                    f"({', '.join(sorted(request.subset)) or 'empty'}) is in the pool",
                    code="no_endpoint_in_subset",
                )
        priority = request_priority(request.headers, self.admission)
        if priority < 0 and pool_saturated(ctx, snapshot.endpoints, self.saturation):
            raise ShedError(
                f"the pool is saturated and this request is sheddable (priority {priority}); "
                "retry later",
                code="shed",
            )
        targets = self.profiles[self.primary].run(ctx, candidates)
        return SchedulingResult(tuple(t.endpoint for t in targets))

    def on_routed(
        self, request: InferenceRequest, result: SchedulingResult, snapshot: Snapshot
    ) -> None:
        for observer in self.observers:
            observer.on_routed(request, result, snapshot)
