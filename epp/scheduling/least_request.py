"""Least outstanding requests, by the EPP's own in-flight count, random tie-break."""

from __future__ import annotations

import random

from epp.errors import NoEndpointError
from epp.types import EndpointState, InferenceRequest, Role, SchedulingResult, Snapshot


class LeastRequestScheduler:
    """Routes to a serving endpoint (decode or prefill-decode) with the fewest requests
    in flight; ties are broken at random so equal endpoints share load."""

    def schedule(
        self, request: InferenceRequest, snapshot: Snapshot, rng: random.Random
    ) -> SchedulingResult:
        best: list[EndpointState] = []
        best_load = -1
        in_flight = snapshot.in_flight
        for state in snapshot.endpoints:
            if state.endpoint.role is Role.PREFILL:
                continue
            load = in_flight.get(state.address, 0)
            if not best or load < best_load:
                best, best_load = [state], load
            elif load == best_load:
                best.append(state)
        if not best:
            raise NoEndpointError("no ready endpoint to serve the request", code="no_endpoint")
        choice = best[0] if len(best) == 1 else rng.choice(best)
        return SchedulingResult(targets=(choice.endpoint,))
