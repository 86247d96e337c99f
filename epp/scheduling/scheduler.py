"""The configured scheduler: subset hint -> admission -> profile -> targets."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from epp.errors import NoEndpointError, ShedError
from epp.scheduling.base import (
    VECTORIZE_FROM,
    CycleContext,
    ProfileHandler,
    ProfileRunner,
    RoutingObserver,
)
from epp.scheduling.profile import Profile
from epp.scheduling.saturation import (
    AdmissionConfig,
    SaturationConfig,
    pool_saturated,
    request_priority,
)
from epp.types import EndpointState, InferenceRequest, SchedulingResult, Snapshot


class SingleProfileHandler:
    """Runs the first (usually the only) profile; its picks are the targets."""

    def run(
        self,
        ctx: CycleContext,
        profiles: Sequence[ProfileRunner],
        candidates: Sequence[EndpointState],
    ) -> SchedulingResult:
        targets = profiles[0].run(ctx, candidates)
        return SchedulingResult(tuple(t.endpoint for t in targets))


@dataclass
class ProfileScheduler:
    """Subset hint -> admission -> the profile handler. Pure except for plugins' routing
    observers, which the router calls after a request is routed."""

    profiles: Sequence[Profile]
    handler: ProfileHandler
    saturation: SaturationConfig
    admission: AdmissionConfig
    stale_after_s: float
    clock: Callable[[], float]
    observers: Sequence[RoutingObserver] = ()
    # every configured plugin by name (for reporting, e.g. the prefix index's size)
    plugins: Mapping[str, object] = field(default_factory=dict)
    # candidate lists this long or longer are scored with numpy (CycleContext.vectorize)
    vectorize_from: int = VECTORIZE_FROM

    def schedule(
        self, request: InferenceRequest, snapshot: Snapshot, rng: random.Random
    ) -> SchedulingResult:
        ctx = CycleContext(
            request, snapshot, self.clock(), rng, self.stale_after_s, {}, self.vectorize_from
        )
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
        return self.handler.run(ctx, self.profiles, candidates)

    def on_routed(
        self, request: InferenceRequest, result: SchedulingResult, snapshot: Snapshot
    ) -> None:
        for observer in self.observers:
            observer.on_routed(request, result, snapshot)
