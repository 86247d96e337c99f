"""Pickers: turn scored candidates into an ordered target list (primary + fallbacks)."""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from typing import TypeVar

import numpy as np

from epp.common.params import Params
from epp.scheduling.base import CycleContext
from epp.scheduling.columns import FloatArray
from epp.types import EndpointState

T = TypeVar("T")


class MaxScorePicker:
    """Highest total score first; ties broken at random (so equal endpoints share load).
    Returns up to ``maxTargets`` endpoints, best first."""

    def __init__(self, max_targets: int) -> None:
        self.max_targets = max_targets

    def pick(
        self, ctx: CycleContext, scored: Sequence[tuple[EndpointState, float]]
    ) -> list[EndpointState]:
        if self.max_targets == 1 and scored:
            best = max(score for _, score in scored)
            top = [s for s, score in scored if score == best]
            return [top[0] if len(top) == 1 else ctx.rng.choice(top)]
        k = self.max_targets
        pool = list(scored)
        if len(pool) > k:  # only the top k scores (and ties at the cut) get random keys
            cutoff = heapq.nlargest(k, [score for _, score in pool])[-1]
            pool = [p for p in pool if p[1] >= cutoff]
        rand = ctx.rng.random
        keyed = sorted(((score, rand(), s) for s, score in pool), key=_score_then_tie, reverse=True)
        return [s for _, _, s in keyed[:k]]

    def pick_scores(
        self, ctx: CycleContext, candidates: Sequence[EndpointState], totals: FloatArray
    ) -> list[EndpointState]:
        """:meth:`pick` with the scores as one array (many candidates): the same picks,
        drawing the same random numbers."""
        n = len(totals)
        if n == 0:
            return []
        if self.max_targets == 1:
            top = np.flatnonzero(totals == totals.max())
            return [candidates[int(top[0] if len(top) == 1 else ctx.rng.choice(top))]]
        k = self.max_targets
        # only the top k scores (and ties at the cut) get random keys, in candidate order
        pool = np.flatnonzero(totals >= np.partition(totals, n - k)[n - k]) if n > k else range(n)
        indices: list[int] = list(map(int, pool))
        rand = ctx.rng.random
        keyed = sorted(
            ((score, rand(), i) for score, i in zip(totals[pool].tolist(), indices, strict=True)),
            key=_score_then_tie,
            reverse=True,
        )
        return [candidates[i] for _, _, i in keyed[:k]]


class RandomPicker:
    """Uniformly random, ignoring scores (a baseline)."""

    def __init__(self, max_targets: int) -> None:
        self.max_targets = max_targets

    def pick(
        self, ctx: CycleContext, scored: Sequence[tuple[EndpointState, float]]
    ) -> list[EndpointState]:
        states = [s for s, _ in scored]
        return ctx.rng.sample(states, min(self.max_targets, len(states)))


class WeightedRandomPicker:
    """Random in proportion to score (weighted sampling without replacement; all-zero
    scores fall back to uniform)."""

    def __init__(self, max_targets: int) -> None:
        self.max_targets = max_targets

    def pick(
        self, ctx: CycleContext, scored: Sequence[tuple[EndpointState, float]]
    ) -> list[EndpointState]:
        if not any(score > 0 for _, score in scored):
            return RandomPicker(self.max_targets).pick(ctx, scored)
        # Efraimidis-Spirakis: key = u^(1/w); zero weights sort last.
        keyed = []
        for s, score in scored:
            u = ctx.rng.random() or 1e-300
            keyed.append((math.log(u) / score if score > 0 else -math.inf, s))
        keyed.sort(key=lambda k: k[0], reverse=True)
        return [s for _, s in keyed[: self.max_targets]]


def _score_then_tie(k: tuple[float, float, T]) -> tuple[float, float]:
    return k[0], k[1]


def _targets(p: Params) -> int:
    return p.integer("maxTargets", 1, minimum=1)


def max_score_picker(p: Params) -> MaxScorePicker:
    return MaxScorePicker(_targets(p))


def random_picker(p: Params) -> RandomPicker:
    return RandomPicker(_targets(p))


def weighted_random_picker(p: Params) -> WeightedRandomPicker:
    return WeightedRandomPicker(_targets(p))
