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
            w = ws.weight
            scores = ws.scorer.score(ctx, current)
            # clamp to [0, 1] (NaN -> 0): a misbehaving scorer cannot outweigh the others
            totals = [
                t + w * (x if 0.0 <= x <= 1.0 else (1.0 if x > 1.0 else 0.0))
                for t, x in zip(totals, scores, strict=True)
            ]
        return self.picker.pick(ctx, list(zip(current, totals, strict=True)))
