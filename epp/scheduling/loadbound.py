"""The prefix scorers' load bound: an endpoint far above the candidates' mean load
loses its prefix score, so a busy prefix spills to a less loaded endpoint, which then
caches it too (bounded-load consistent hashing, applied to cache affinity).

With ``hotGroupShare`` the bound tells a group too big for one endpoint (spill it)
from a group that fits its home (random swings of load must not move it): a prompt
group is the prompt's first ``groupTokens`` tokens, and its share of the recent
traffic is counted over about the last :data:`WINDOW` routed requests (pure: time is
counted in requests, not seconds)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from epp.common.params import Params
from epp.scheduling.base import CycleContext
from epp.scheduling.columns import CandidateView, FloatArray
from epp.types import CHARS_PER_TOKEN, EndpointState, InferenceRequest

# in-flight above this x the candidates' mean (+1) loses the prefix score (0 = off)
LOAD_BOUND = 1.25
# routed requests over which a group's share is averaged (the decay's time constant)
WINDOW = 512
# a group carrying this share of one endpoint's fair share of the traffic is hot (0: no
# group is told apart, every request is bounded by loadBound). Off by default: with KV
# for 2.5 copies of equal groups, homes kept regardless of load swings doubled p90 at 0.7
# of capacity on the routing model (bench/results/routing-model-shared.md)
HOT_SHARE = 0.0


class GroupShares:
    """Exponentially decayed count of routed requests per group key, over about
    ``window`` requests; :meth:`share` is a group's fraction of them."""

    def __init__(self, window: int = WINDOW) -> None:
        self._decay = 1.0 / window
        self._prune_at = 8 * window  # entries kept before the negligible ones are dropped
        self._tick = 0
        self._total = 0.0  # decayed count of every group, as of _tick
        self._counts: dict[int, tuple[float, int]] = {}  # key -> (count, as of tick)

    def share(self, key: int) -> float:
        entry = self._counts.get(key)
        if entry is None or self._total <= 0.0:
            return 0.0
        count, tick = entry
        return count * math.exp((tick - self._tick) * self._decay) / self._total

    def routed(self, key: int) -> None:
        self._tick += 1
        self._total = self._total * math.exp(-self._decay) + 1.0
        count, tick = self._counts.get(key, (0.0, self._tick))
        self._counts[key] = (count * math.exp((tick - self._tick) * self._decay) + 1.0, self._tick)
        if len(self._counts) > self._prune_at:
            now, decay = self._tick, self._decay
            self._counts = {
                k: (c, t)
                for k, (c, t) in self._counts.items()
                if c * math.exp((t - now) * decay) > 0.01
            }


class LoadBound:
    """Which candidates lose their prefix score for being too busy. Parameters (read
    by :meth:`from_params`, shared by both prefix scorers): ``loadBound`` (1.25; 0 =
    off): more EPP in-flight requests than this x the candidates' mean + 1;
    ``loadBoundKeepsFreeSlot`` (false): only an endpoint with no free slot (in-flight
    at least its slots as configured, labelled or learned; unknown slots: the bound
    alone); ``hotGroupShare`` (0 = every request bounded by ``loadBound``; 1 tried): a group
    carrying less than this share of one endpoint's fair share of the recent traffic
    is bounded by ``coldGroupLoadBound`` (0 = not bounded) instead;
    ``coldGroupKeepsFreeSlot`` (false): a cold group's home above that bound keeps the
    score while it has a free slot (:meth:`full`), so the group leaves it only for a
    wait, not for a swing of in-flight requests that its slots absorb; ``groupTokens``
    (128): the leading tokens that name a prompt's group."""

    def __init__(
        self,
        bound: float = LOAD_BOUND,
        *,
        keep_free_slot: bool = False,
        hot_share: float = HOT_SHARE,
        cold_bound: float = 0.0,
        cold_keeps_free_slot: bool = False,
        group_tokens: int = 128,
    ) -> None:
        self.bound = bound
        self.keep_free_slot = keep_free_slot
        self.hot_share = hot_share
        self.cold_bound = cold_bound
        self.cold_keeps_free_slot = cold_keeps_free_slot
        self.group_tokens = group_tokens
        self._group_chars = round(group_tokens * CHARS_PER_TOKEN)
        self.groups = GroupShares()

    @classmethod
    def from_params(cls, p: Params) -> LoadBound:
        return cls(
            p.number("loadBound", LOAD_BOUND, minimum=0.0),
            keep_free_slot=p.boolean("loadBoundKeepsFreeSlot", False),
            hot_share=p.number("hotGroupShare", HOT_SHARE, minimum=0.0),
            cold_bound=p.number("coldGroupLoadBound", 0.0, minimum=0.0),
            cold_keeps_free_slot=p.boolean("coldGroupKeepsFreeSlot", False),
            group_tokens=p.integer("groupTokens", 128, minimum=1),
        )

    def group(self, request: InferenceRequest) -> int:
        """The request's group key: its model and leading ``groupTokens`` tokens, as
        characters at 4 a token (a fixed count: a key that followed the learned
        characters per token would rename every group when the ratio moves)."""
        return hash((request.model, request.prompt[: self._group_chars]))

    def for_request(self, request: InferenceRequest, candidates: int) -> tuple[float, bool]:
        """The bound ``request`` is held to among ``candidates`` endpoints (0: none), and
        whether an endpoint above it keeps the prefix score while it has a free slot
        (a cold group with ``coldGroupKeepsFreeSlot``)."""
        if self.hot_share <= 0.0:
            return self.bound, False
        if self.groups.share(self.group(request)) * candidates >= self.hot_share:
            return self.bound, False
        return self.cold_bound, self.cold_keeps_free_slot

    def routed(self, request: InferenceRequest) -> None:
        """Count a routed request in its group's share."""
        if self.hot_share > 0.0:
            self.groups.routed(self.group(request))

    @staticmethod
    def full(ctx: CycleContext, state: EndpointState, load: float) -> bool:
        """Whether ``state``, with ``load`` EPP in-flight requests, has no free slot:
        in-flight at least its slots where they are known (configured, labelled, or
        learned while requests waited), else the server reports requests waiting; an
        endpoint with no fresh report counts as full (the bound alone decides)."""
        slots = ctx.latency.endpoint(state).reported_slots
        if slots:
            return load >= slots
        metrics = ctx.metrics(state)
        return metrics is None or metrics.waiting is None or metrics.waiting > 0

    def withhold(
        self, ctx: CycleContext, candidates: Sequence[EndpointState], scores: list[float]
    ) -> list[float]:
        """``scores`` (one per candidate) with the too-busy candidates' set to 0."""
        bound, keeps_slot = self.for_request(ctx.request, len(candidates))
        if bound <= 0 or len(candidates) < 2:
            return scores
        in_flight = ctx.snapshot.in_flight
        loads = [in_flight.get(s.address, 0) for s in candidates]
        cap = bound * sum(loads) / len(loads) + 1
        if self.keep_free_slot:
            model = ctx.latency.endpoint
            slots = [model(s).reported_slots or 0 for s in candidates]
            loads = [ld if ld >= n else 0 for ld, n in zip(loads, slots, strict=True)]
        if keeps_slot:
            full = self.full
            return [
                0.0 if load > cap and full(ctx, s, load) else x
                for x, load, s in zip(scores, loads, candidates, strict=True)
            ]
        return [0.0 if load > cap else x for x, load in zip(scores, loads, strict=True)]

    def withhold_view(self, ctx: CycleContext, view: CandidateView, scores: FloatArray) -> None:
        """:meth:`withhold` on numpy columns, in place."""
        n = len(scores)
        bound, keeps_slot = self.for_request(ctx.request, n)
        if bound <= 0 or n < 2:
            return
        load = view.counts(ctx.snapshot.in_flight)
        over = load > bound * float(load.sum()) / n + 1
        if self.keep_free_slot:
            over &= load >= ctx.latency.reported_slots_view(view)
        if keeps_slot:  # few candidates are above the bound: ask only about those
            for i in np.flatnonzero(over).tolist():
                over[i] = self.full(ctx, view.candidates[i], float(load[i]))
        scores[over] = 0.0
