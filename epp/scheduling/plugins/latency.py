"""Rank candidates by the time to first token the latency model predicts for this
request on each of them (epp.scheduling.latency), with what the prefix index says each
one caches.

For candidate ``e``: ``cost = queue wait(e) + overhead(e) + prefill rate(e) x
uncached tokens on e + output tokens x decode slowdown per running request(e) x
requests on e + eviction x recompute cost of the cached blocks the prompt would push out
of e``. A cache hit behind a short queue beats a miss on an idle endpoint; a hot prefix
gets a second home once its home's wait and batch cost more than a miss elsewhere,
eviction included. An endpoint whose load is unknown (no fresh report) is charged one
slot time, as if it might be full: never preferred, never excluded. With nothing cached
anywhere the load terms decide, as least-request would (``out``: the request's
``max_tokens``, else the model's ``outputTokens`` prior). With ``homeShare`` (0 = off,
epp.scheduling.groups), once as many candidates hold this request's group as its share
of the traffic needs, each other candidate is charged one more miss: a further copy
would evict other groups' prefixes.

With SLO headers (``x-llm-d-slo-ttft-ms`` / ``x-llm-d-slo-tpot-ms``, or the older
``x-slo-ttft-ms`` / ``x-slo-tpot-ms``) the endpoints predicted to meet them always
score above those that are not; among each set the cheapest wins, so with none able to
meet them the request still goes where it is served soonest (best effort).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from epp.common.params import ConfigError, Params
from epp.scheduling.base import CycleContext
from epp.scheduling.columns import FloatArray
from epp.scheduling.groups import GroupShares, homes_needed
from epp.scheduling.latency import UNCACHED_KEY, LatencyModel, slo_missed
from epp.scheduling.plugins.precise import PrecisePrefixCacheScorer
from epp.scheduling.plugins.prefix import PrefixCacheScorer
from epp.scheduling.prefixindex import block_hashes
from epp.types import EndpointState, InferenceRequest, SchedulingResult, Snapshot

DEFAULT_PREFIX_PLUGIN = "prefix-cache-scorer"
# preferred when configured: what the servers report holding, not what was routed
PRECISE_PREFIX_PLUGIN = "precise-prefix-cache-scorer"
# per in-flight request: orders otherwise equal predictions by load (seconds)
TIE_BREAK_S = 1e-4
FLOOR_S = 1e-3  # costs below this count as this (scores are ratios to the best)


class UncachedEstimates:
    """address -> uncached prompt tokens estimated on it, as one cycle's scorer left
    them (``ctx.cache[UNCACHED_KEY]``) for the scheduler's prediction of its pick."""

    __slots__ = ("_addresses", "_values")

    def __init__(self, addresses: Sequence[str], values: Sequence[float] | FloatArray) -> None:
        self._addresses, self._values = addresses, values

    def get(self, address: str, default: int) -> int:
        try:
            return int(self._values[self._addresses.index(address)])
        except ValueError:
            return default


class PredictedLatencyScorer:
    """Score = cheapest cost among the candidates / this candidate's cost (0..1]; with
    SLO headers, see the module docstring."""

    def __init__(
        self,
        where: str,
        prefix_plugin: str | None,
        eviction_weight: float,
        home_share: float = 0.0,
    ) -> None:
        self.where = where
        self.prefix_plugin = prefix_plugin
        self.eviction_weight = eviction_weight
        self.home_share = home_share
        self.groups = GroupShares()
        self.prefix: PrefixCacheScorer | None = None
        self.precise: PrecisePrefixCacheScorer | None = None

    def bind(self, plugins: Mapping[str, Any], profiles: Sequence[str]) -> None:
        name = self.prefix_plugin
        if name is None:
            name = (
                PRECISE_PREFIX_PLUGIN if PRECISE_PREFIX_PLUGIN in plugins else DEFAULT_PREFIX_PLUGIN
            )
        plugin = plugins.get(name)
        if isinstance(plugin, PrecisePrefixCacheScorer):
            self.precise = plugin
        elif isinstance(plugin, PrefixCacheScorer):
            self.prefix = plugin
        elif self.prefix_plugin is not None:
            raise ConfigError(
                f"{self.where}.prefixPlugin: {name!r} is not a configured prefix-cache-scorer "
                "or precise-prefix-cache-scorer"
            )
        # else: no index; every prompt token counts as uncached everywhere

    def _index(self) -> PrefixCacheScorer | None:
        """The approximate index (the precise scorer's fallback): its blocks key groups."""
        return self.precise.fallback if self.precise is not None else self.prefix

    def on_routed(
        self, request: InferenceRequest, result: SchedulingResult, snapshot: Snapshot
    ) -> None:
        prefix = self._index()
        if self.home_share > 0 and prefix is not None and request.prompt:
            first = block_hashes(request.model or "", request.prompt, prefix.block_chars, 1)
            if first:
                self.groups.routed(first[0])

    def _homes(self, ctx: CycleContext, candidates: int) -> int:
        """Homes this request's group should have (``candidates``: unlimited)."""
        prefix = self._index()
        if self.home_share <= 0 or prefix is None:
            return candidates
        hashes = prefix.hashes(ctx)
        if not hashes:
            return candidates
        return homes_needed(self.groups.share(hashes[0]), candidates, self.home_share)

    def _cached(self, ctx: CycleContext) -> tuple[int, Mapping[str, int], PrefixCacheScorer | None]:
        """(prompt tokens, address -> prompt tokens it caches, the approximate scorer
        whose geometry estimates free blocks): precise where the servers report their
        blocks and the prompt's real tokens are known, else approximate."""
        if self.precise is not None:
            precise = self.precise
            return precise.prompt_tokens(ctx), precise.cached_tokens(ctx), precise.fallback
        prefix = self.prefix
        if prefix is None:
            return ctx.request.prompt_tokens, {}, None
        block = prefix.block_tokens_of(ctx.request)
        cached = {a: round(n * block) for a, n in prefix.matches(ctx).items()}
        return ctx.request.prompt_tokens, cached, prefix

    def score(
        self, ctx: CycleContext, candidates: Sequence[EndpointState]
    ) -> list[float] | FloatArray:
        if not candidates:
            return []
        if ctx.vectorize(candidates):
            costs, ttft, tpot = self._costs_vectorized(ctx, candidates)
        else:
            costs_list, ttft_list, tpot_list = self._costs(ctx, candidates)
            costs, ttft, tpot = np.array(costs_list), np.array(ttft_list), np.array(tpot_list)
        request = ctx.request
        if request.slo_ttft_ms is None and request.slo_tpot_ms is None:
            result: FloatArray = costs.min() / costs
            return result
        missed = np.asarray(slo_missed(request, ttft, tpot), np.bool_)  # one per candidate
        best_meet = float(costs[~missed].min()) if not missed.all() else 0.0
        scored: FloatArray = np.where(
            missed, 0.5 * float(costs.min()) / costs, 0.5 + 0.5 * best_meet / costs
        )
        return scored

    def _costs(
        self, ctx: CycleContext, candidates: Sequence[EndpointState]
    ) -> tuple[list[float], list[float], list[float]]:
        """(cost, TTFT, TPOT) per candidate, one at a time (few candidates)."""
        model: LatencyModel = ctx.latency
        tokens, cached, prefix = self._cached(ctx)
        block = prefix.block_tokens_of(ctx.request) if prefix is not None else 1.0
        in_flight = ctx.snapshot.in_flight
        evict = self.eviction_weight if prefix is not None else 0.0
        out = ctx.request.max_tokens or model.priors.output_tokens
        costs, ttfts, tpots, uncached_all = [], [], [], []
        homes = self._homes(ctx, len(candidates))
        enough = sum(1 for s in candidates if cached.get(s.address, 0) > 0) >= homes
        for state, metrics in zip(candidates, ctx.fresh_metrics(candidates), strict=True):
            address = state.address
            uncached = max(tokens - cached.get(address, 0), 0)
            uncached_all.append(uncached)
            pred = model.predict(state, metrics, in_flight.get(address, 0), uncached)
            learned = model.endpoint(state)
            rate = learned.prefill.b
            # its own decode, slowed by each request already running there
            cost = pred.ttft_s + (out * learned.decode.b + TIE_BREAK_S) * pred.load
            if metrics is None:  # load unknown: it may be full, as if one slot time away
                cost += learned.slot_s
            if evict and uncached and prefix is not None:
                pushed = math.ceil(uncached / block) - prefix.free_blocks(
                    state, ctx.request.chars_per_token
                )
                if pushed > 0:
                    cost += evict * pushed * block * rate
            if enough and not cached.get(address, 0):  # a copy beyond the group's homes
                cost += uncached * rate
            costs.append(max(cost, FLOOR_S))
            ttfts.append(pred.ttft_s)
            tpots.append(pred.tpot_s)
        addresses = [s.address for s in candidates]
        ctx.cache[UNCACHED_KEY] = UncachedEstimates(addresses, uncached_all)
        return costs, ttfts, tpots

    def _costs_vectorized(
        self, ctx: CycleContext, candidates: Sequence[EndpointState]
    ) -> tuple[FloatArray, FloatArray, FloatArray]:
        """:meth:`_costs` with numpy (many candidates); the same numbers. TPOT is only
        computed when an SLO asks for it (NaN otherwise)."""
        model: LatencyModel = ctx.latency
        view = ctx.view(candidates)
        tokens, cached, prefix = self._cached(ctx)
        block = prefix.block_tokens_of(ctx.request) if prefix is not None else 1.0
        uncached = np.maximum(tokens - view.by_address(cached), 0.0)
        predicted = model.predict_view(view, ctx.snapshot.in_flight, uncached)
        ttft, load, rate, slope, slot_s = predicted
        out = ctx.request.max_tokens or model.priors.output_tokens
        costs = ttft + (out * slope + TIE_BREAK_S) * load
        costs = costs + np.where(view.fresh(), 0.0, slot_s)  # load unknown: maybe full
        if self.eviction_weight and prefix is not None:
            free = prefix.free_blocks_view(view, ctx.request.chars_per_token)
            pushed = np.maximum(np.ceil(uncached / block) - free, 0.0)
            costs = costs + self.eviction_weight * pushed * block * rate
        homes = self._homes(ctx, len(candidates))
        if homes < len(candidates):
            holders = view.by_address(cached) > 0
            if int(holders.sum()) >= homes:  # copies beyond the group's homes: a miss more
                costs = costs + np.where(holders, 0.0, uncached * rate)
        ctx.cache[UNCACHED_KEY] = UncachedEstimates(view.addresses, uncached)
        if ctx.request.slo_tpot_ms is not None:  # rare: one at a time
            in_flight = ctx.snapshot.in_flight
            tpot = np.array(
                [
                    model.predict(s, m, in_flight.get(s.address, 0), 0).tpot_s
                    for s, m in zip(candidates, ctx.fresh_metrics(candidates), strict=True)
                ]
            )
        else:
            tpot = np.full(len(candidates), np.nan)
        result: FloatArray = np.maximum(costs, FLOOR_S)
        return result, ttft, tpot


def predicted_latency_scorer(p: Params) -> PredictedLatencyScorer:
    prefix = p.get("prefixPlugin")
    if prefix is not None and (not isinstance(prefix, str) or not prefix):
        raise ConfigError(f"{p.where}.prefixPlugin: the name of a prefix-cache-scorer plugin")
    return PredictedLatencyScorer(
        where=p.where,
        prefix_plugin=prefix,
        eviction_weight=p.number("evictionWeight", 0.5, minimum=0.0),
        home_share=p.number("homeShare", 0.0, minimum=0.0),
    )
