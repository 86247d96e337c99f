"""LoRA adapter affinity: a request whose ``model`` names an adapter goes where that
adapter is active, else where it is already loading or a slot is free, else where it
waits least; within each of those tiers, the shortest predicted wait first.

What a server reports (vLLM's ``vllm:lora_requests_info``): the adapters its running
requests use (``running``), those its waiting requests need (``waiting``: the server
brings them in as slots free) and its slot count (``max_lora``). An endpoint's tier for
adapter ``a``:

* ``ACTIVE``: ``a`` in running (served at once, no swap);
* ``LOADING``: ``a`` in waiting (already on its way in);
* ``FREE``: fewer running adapters than slots (``a`` can come in without evicting);
* ``FULL``: every slot busy with other adapters (the request waits for one, then swaps).

A request counts as an adapter request when the router flagged it (its model is in the
EPP's adapter catalogue, ``lora.adapters``) or some candidate reports the model running
or waiting. Nothing here acts when no candidate reports LoRA state (plain pools, SGLang
or TensorRT-LLM servers) or the request names no adapter: the filter keeps every
candidate and the scorer gives every one 0, so picks are those of the other plugins.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from enum import IntEnum

from epp.common.params import Params
from epp.scheduling.base import CycleContext
from epp.types import EndpointMetrics, EndpointState, InferenceRequest, SchedulingResult, Snapshot


class Tier(IntEnum):
    FULL = 0
    FREE = 1
    LOADING = 2
    ACTIVE = 3


# the tiers the filter keeps together: a free slot and a load under way are both "it
# can run here soon", ranked by wait
GROUP = {Tier.FULL: 0, Tier.FREE: 1, Tier.LOADING: 1, Tier.ACTIVE: 2}


def tier(m: EndpointMetrics | None, adapter: str) -> Tier | None:
    """``adapter``'s tier on an endpoint reporting ``m``; None without LoRA state."""
    if m is None or m.max_lora is None:
        return None
    if adapter in m.lora_running:
        return Tier.ACTIVE
    if adapter in m.lora_waiting:
        return Tier.LOADING
    if len(m.lora_running) < m.max_lora:
        return Tier.FREE
    return Tier.FULL


def tiers(ctx: CycleContext, candidates: Sequence[EndpointState]) -> list[Tier | None] | None:
    """Each candidate's tier for the request's adapter, or None when LoRA plays no part
    (no model, no candidate with LoRA state, or the model is no adapter anyone knows)."""
    key = ("lora-tiers", id(candidates))
    cached = ctx.cache.get(key)
    if cached is not None and cached[0] is candidates:
        result: list[Tier | None] | None = cached[1]
        return result
    result = _tiers(ctx, candidates)
    ctx.cache[key] = (candidates, result)
    return result


def _tiers(ctx: CycleContext, candidates: Sequence[EndpointState]) -> list[Tier | None] | None:
    model = ctx.request.model
    if model is None or not _reports_lora(ctx):
        return None
    metrics = ctx.fresh_metrics(candidates)
    if all(m is None or m.max_lora is None for m in metrics):
        return None
    known = ctx.request.lora_adapter or any(
        m is not None and (model in m.lora_running or model in m.lora_waiting) for m in metrics
    )
    if not known:
        return None
    return [tier(m, model) for m in metrics]


def _reports_lora(ctx: CycleContext) -> bool:
    return _snapshot_reports_lora(ctx.snapshot)


def _snapshot_reports_lora(snapshot: Snapshot) -> bool:
    """Whether any endpoint of the snapshot has reported LoRA state (once per snapshot:
    a pool without LoRA pays one lookup per request)."""
    derived = snapshot.derived
    found = derived.get("lora-reported")
    if found is None:
        found = derived["lora-reported"] = any(
            s.metrics is not None and s.metrics.max_lora is not None for s in snapshot.endpoints
        )
    return bool(found)


class LoraAffinityFilter:
    """Keeps the candidates of the best tier group present: where the adapter is active;
    else where it is loading or a slot is free; else (every slot everywhere busy) all,
    for the scorers to find where it waits least. Inactive without LoRA state."""

    def filter(
        self, ctx: CycleContext, candidates: Sequence[EndpointState]
    ) -> Sequence[EndpointState]:
        found = tiers(ctx, candidates)
        if found is None:
            return candidates
        groups = [GROUP[t] if t is not None else -1 for t in found]
        best = max(groups)
        if best <= 0:
            return candidates
        return [s for s, g in zip(candidates, groups, strict=True) if g == best]


def lora_affinity_filter(p: Params) -> LoraAffinityFilter:
    return LoraAffinityFilter()


class LoraAffinityScorer:
    """Orders candidates by tier group (active, then loading or free slot, then full or
    no LoRA state), and within a group by the predicted wait (the latency model's queue
    wait, plus ``swapSeconds`` where the adapter has to evict another): scores in
    [2/3, 1] for the active group, [1/3, 2/3) for the next, (0, 1/3) for the full, 0
    without LoRA state; with enough weight it decides alone. 0 everywhere when
    inactive.

    A server lists only the adapters its requests are using, not those idle in its
    slots; so this scorer also remembers, per endpoint, the last ``max_lora`` distinct
    adapters it routed there (an approximate slot table, as the prefix index is for
    cached prompts). In the middle group, an endpoint that probably still holds the
    adapter (no swap) ranks above those that do not, whatever their wait.
    """

    def __init__(self, swap_s: float, wait_scale_s: float) -> None:
        self.swap_s = swap_s
        self.wait_scale_s = wait_scale_s
        # address -> adapters routed there, least recently first (at most its max_lora)
        self._recent: dict[str, OrderedDict[str, None]] = {}
        self._version = -1

    def score(self, ctx: CycleContext, candidates: Sequence[EndpointState]) -> list[float]:
        found = tiers(ctx, candidates)
        if found is None:
            return [0.0] * len(candidates)
        model = ctx.request.model
        in_flight = ctx.snapshot.in_flight
        metrics = ctx.fresh_metrics(candidates)
        out = []
        for s, m, t in zip(candidates, metrics, found, strict=True):
            if t is None:  # no LoRA state: probably cannot serve the adapter at all
                out.append(0.0)
                continue
            wait = ctx.latency.predict(s, m, in_flight.get(s.address, 0), 0).wait_s
            if t is Tier.FULL:
                wait += self.swap_s
            # 1 at no wait, towards 0 as the wait grows
            closeness = 1.0 / (1.0 + wait / self.wait_scale_s)
            recent = self._recent.get(s.address)
            warm = t is Tier.ACTIVE or (recent is not None and model in recent)
            out.append((GROUP[t] + 0.5 * warm + 0.499 * closeness) / 3.0)
        return out

    def on_routed(
        self, request: InferenceRequest, result: SchedulingResult, snapshot: Snapshot
    ) -> None:
        model = request.model
        if model is None or not _snapshot_reports_lora(snapshot):
            return
        if snapshot.version != self._version:  # membership changed: forget removed ones
            self._version = snapshot.version
            live = {s.address for s in snapshot.endpoints}
            self._recent = {a: r for a, r in self._recent.items() if a in live}
        address = result.primary.address
        state = snapshot.state(address)
        m = state.metrics if state is not None else None
        if m is None or m.max_lora is None:
            return
        recent = self._recent.setdefault(address, OrderedDict())
        recent[model] = None
        recent.move_to_end(model)
        while len(recent) > max(m.max_lora, 0):
            recent.popitem(last=False)


def lora_affinity_scorer(p: Params) -> LoraAffinityScorer:
    return LoraAffinityScorer(
        swap_s=p.number("swapSeconds", 0.05, minimum=0.0),
        wait_scale_s=p.number("waitScaleSeconds", 1.0, minimum=1e-6),
    )
