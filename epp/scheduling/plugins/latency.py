"""Rank candidates by the time to first token the latency model predicts for this
request on each of them (epp.scheduling.latency), with what the prefix index says each
one caches.

For candidate ``e``: ``cost = queue wait(e) + overhead(e) + prefill rate(e) x
uncached tokens on e + eviction x recompute cost of the cached blocks the prompt would
push out of e``. A cache hit behind a short queue beats a miss on an idle endpoint; a
hot prefix gets a second home only once its home's wait exceeds what a miss elsewhere
costs, eviction included. Ties (equal predictions, e.g. no shared prefix and free
slots) go to the endpoint with the fewest requests, as least-request would.

With SLO headers (``x-llm-d-slo-ttft-ms`` / ``x-llm-d-slo-tpot-ms``, or the older
``x-slo-ttft-ms`` / ``x-slo-tpot-ms``) the endpoints predicted to meet them always
score above those that are not; among each set the cheapest wins, so with none able to
meet them the request still goes where it is served soonest (best effort).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from epp.scheduling.base import CycleContext
from epp.scheduling.latency import UNCACHED_KEY, LatencyModel
from epp.scheduling.params import ConfigError, Params
from epp.scheduling.plugins.prefix import PrefixCacheScorer
from epp.types import EndpointState

DEFAULT_PREFIX_PLUGIN = "prefix-cache-scorer"
# per in-flight request: orders otherwise equal predictions by load (seconds)
TIE_BREAK_S = 1e-4
FLOOR_S = 1e-3  # costs below this count as this (scores are ratios to the best)


class PredictedLatencyScorer:
    """Score = cheapest cost among the candidates / this candidate's cost (0..1]."""

    def __init__(self, where: str, prefix_plugin: str | None, eviction_weight: float) -> None:
        self.where = where
        self.prefix_plugin = prefix_plugin
        self.eviction_weight = eviction_weight
        self.prefix: PrefixCacheScorer | None = None

    def bind(self, plugins: Mapping[str, Any], profiles: Sequence[str]) -> None:
        name = self.prefix_plugin or DEFAULT_PREFIX_PLUGIN
        plugin = plugins.get(name)
        if isinstance(plugin, PrefixCacheScorer):
            self.prefix = plugin
        elif self.prefix_plugin is not None:
            raise ConfigError(
                f"{self.where}.prefixPlugin: {name!r} is not a configured prefix-cache-scorer"
            )
        # else: no index; every prompt token counts as uncached everywhere

    def costs(self, ctx: CycleContext, candidates: Sequence[EndpointState]) -> list[float]:
        """Predicted cost (seconds) per candidate; stashes the uncached-token estimates
        in ``ctx.cache`` for the scheduler's prediction of the chosen one."""
        model: LatencyModel = ctx.latency
        tokens = ctx.request.prompt_tokens
        prefix = self.prefix
        matches: Mapping[str, int] = prefix.matches(ctx) if prefix is not None else {}
        block = prefix.block_tokens if prefix is not None else 1
        in_flight = ctx.snapshot.in_flight
        slo_ttft, slo_tpot = ctx.request.slo_ttft_ms, ctx.request.slo_tpot_ms
        stash: dict[str, int] = ctx.cache.setdefault(UNCACHED_KEY, {})
        evict = self.eviction_weight if prefix is not None else 0.0
        costs: list[float] = []
        misses: list[bool] = []
        for state, metrics in zip(candidates, ctx.fresh_metrics(candidates), strict=True):
            address = state.address
            uncached = max(tokens - matches.get(address, 0) * block, 0)
            stash[address] = uncached
            pred = model.predict(state, metrics, in_flight.get(address, 0), uncached)
            cost = pred.ttft_s + TIE_BREAK_S * pred.load
            if evict and uncached and prefix is not None:
                pushed = math.ceil(uncached / block) - prefix.free_blocks(state)
                if pushed > 0:
                    model_rate = model.endpoint(state).prefill.b
                    cost += evict * pushed * block * model_rate
            costs.append(max(cost, FLOOR_S))
            misses.append(
                (slo_ttft is not None and pred.ttft_s * 1000 > slo_ttft)
                or (slo_tpot is not None and pred.tpot_s * 1000 > slo_tpot)
            )
        if slo_ttft is not None or slo_tpot is not None:
            ctx.cache["latency/slo-missed"] = dict(
                zip((s.address for s in candidates), misses, strict=True)
            )
        return costs

    def score(self, ctx: CycleContext, candidates: Sequence[EndpointState]) -> list[float]:
        costs = self.costs(ctx, candidates)
        if not costs:
            return []
        missed: Mapping[str, bool] | None = ctx.cache.get("latency/slo-missed")
        if missed is None:
            best = min(costs)
            return [best / c for c in costs]
        flags = [missed[s.address] for s in candidates]
        meeting = [c for c, m in zip(costs, flags, strict=True) if not m]
        best_meet = min(meeting) if meeting else 0.0
        best_all = min(costs)
        return [
            0.5 * best_all / c if m else 0.5 + 0.5 * best_meet / c
            for c, m in zip(costs, flags, strict=True)
        ]


def predicted_latency_scorer(p: Params) -> PredictedLatencyScorer:
    prefix = p._get("prefixPlugin")
    if prefix is not None and (not isinstance(prefix, str) or not prefix):
        raise ConfigError(f"{p.where}.prefixPlugin: the name of a prefix-cache-scorer plugin")
    return PredictedLatencyScorer(
        where=p.where,
        prefix_plugin=prefix,
        eviction_weight=p.number("evictionWeight", 0.5, minimum=0.0),
    )
