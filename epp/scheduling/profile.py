"""A scheduling profile: filters -> weighted scorers -> picker."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from epp.errors import NoEndpointError
from epp.scheduling.base import CycleContext, Filter, Picker, Scorer
from epp.types import EndpointState


@dataclass(frozen=True)
class WeightedScorer:
    name: str
    scorer: Scorer
    weight: float


@dataclass(frozen=True)
class Profile:
    name: str
    filters: tuple[tuple[str, Filter], ...]
    scorers: tuple[WeightedScorer, ...]
    picker: Picker

    def run(self, ctx: CycleContext, candidates: Sequence[EndpointState]) -> list[EndpointState]:
        """Ordered targets (primary first). Raises NoEndpointError naming the filter
        that left nothing, so a 503 says why."""
        current = list(candidates)
        if not current:
            raise NoEndpointError(
                f"no endpoint to run profile '{self.name}' on", code="no_endpoint"
            )
        for name, f in self.filters:
            current = f.filter(ctx, current)
            if not current:
                raise NoEndpointError(
                    f"no endpoint left for profile '{self.name}' after filter '{name}'",
                    code="no_endpoint",
                )
        totals = [0.0] * len(current)
        for ws in self.scorers:
            if ws.weight == 0:
                continue
            scores = ws.scorer.score(ctx, current)
            for i, s in enumerate(scores):
                # clamp: a misbehaving scorer cannot outweigh the others
                totals[i] += ws.weight * (0.0 if s != s else min(1.0, max(0.0, s)))
        return self.picker.pick(ctx, list(zip(current, totals, strict=True)))
