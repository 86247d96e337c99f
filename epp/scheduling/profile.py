"""A scheduling profile: filters -> weighted scorers -> picker."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from epp.errors import NoEndpointError
from epp.scheduling.base import CycleContext, Filter, Picker, Scorer
from epp.scheduling.columns import FloatArray
from epp.types import EndpointState


@dataclass(frozen=True)
class WeightedScorer:
    name: str
    scorer: Scorer
    weight: float


def clamped(scores: Sequence[float] | FloatArray, n: int, scorer: str) -> FloatArray:
    """``scores`` clamped to [0, 1], NaN -> 0 (a misbehaving scorer cannot outweigh the
    others); raises ValueError unless there is exactly one score per candidate."""
    if isinstance(scores, np.ndarray):
        if scores.shape != (n,):
            raise ValueError(f"scorer '{scorer}' returned {scores.shape} scores for {n} candidates")
        # np.minimum keeps NaN, np.fmax then replaces it by 0
        return np.fmax(np.minimum(scores, 1.0, dtype=np.float64), 0.0)
    values = [x if 0.0 <= x <= 1.0 else (1.0 if x > 1.0 else 0.0) for x in scores]
    if len(values) != n:
        raise ValueError(f"scorer '{scorer}' returned {len(values)} scores for {n} candidates")
    return np.array(values, np.float64)


@dataclass(frozen=True)
class Profile:
    name: str
    filters: tuple[tuple[str, Filter], ...]
    scorers: tuple[WeightedScorer, ...]
    picker: Picker

    def run(self, ctx: CycleContext, candidates: Sequence[EndpointState]) -> list[EndpointState]:
        """Ordered targets (primary first). Raises NoEndpointError naming the filter
        that left nothing, so a 503 says why."""
        current = candidates
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
        if ctx.vectorize(current):
            return self._pick_vectorized(ctx, current)
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

    def _pick_vectorized(
        self, ctx: CycleContext, current: Sequence[EndpointState]
    ) -> list[EndpointState]:
        """:meth:`run`'s weighting with numpy (many candidates); the same totals."""
        n = len(current)
        totals = np.zeros(n)
        for ws in self.scorers:
            if ws.weight == 0:
                continue
            scores = clamped(ws.scorer.score(ctx, current), n, ws.name)
            totals += np.multiply(scores, ws.weight, out=scores)
        pick_scores = getattr(self.picker, "pick_scores", None)
        if pick_scores is not None:
            picked: list[EndpointState] = pick_scores(ctx, current, totals)
            return picked
        return self.picker.pick(ctx, list(zip(current, totals.tolist(), strict=True)))
