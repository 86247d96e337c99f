"""Deciders: given the decode endpoint the scheduler chose, is a separate prefill worth
it? Pure functions of the cycle, registered by name."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from epp.common.params import ConfigError, Params
from epp.scheduling.base import CycleContext
from epp.scheduling.latency import interference_s
from epp.types import EndpointState, Role


class CachedTokens(Protocol):
    """Something that estimates which share of the prompt an endpoint caches (the
    prefix-cache scorer: matched blocks / hashed blocks, 0..1), and the prompt's length
    in tokens (the engine's count where the precise scorer tokenized it, else the
    request's :attr:`~epp.types.InferenceRequest.prompt_tokens`)."""

    def cached_fraction(self, ctx: CycleContext, address: str) -> float: ...

    def prompt_tokens(self, ctx: CycleContext) -> int: ...


def _prompt_tokens(estimate: CachedTokens | None, ctx: CycleContext) -> int:
    return ctx.request.prompt_tokens if estimate is None else estimate.prompt_tokens(ctx)


class Decider(Protocol):
    """Contract: synchronous, no I/O; True when the request should be prefilled on a
    separate endpoint before ``decode`` continues it."""

    name: str

    def wants_prefill(self, ctx: CycleContext, decode: EndpointState) -> bool: ...

    def use_cache_estimate(self, estimate: CachedTokens | None) -> None:
        """Receive the pool's prefix-cache estimate (None when none is configured)."""
        ...


class AlwaysDecider:
    name = "always"

    def wants_prefill(self, ctx: CycleContext, decode: EndpointState) -> bool:
        return True

    def use_cache_estimate(self, estimate: CachedTokens | None) -> None:
        pass


class NeverDecider(AlwaysDecider):
    name = "never"

    def wants_prefill(self, ctx: CycleContext, decode: EndpointState) -> bool:
        return False


class PrefixBasedDecider:
    """Disaggregate when the prompt's tokens the decode endpoint does *not* already cache
    reach ``non_cached_tokens``: a short or mostly cached prompt is cheaper to prefill
    where it will decode than to compute and ship elsewhere."""

    name = "prefix-based"

    def __init__(self, non_cached_tokens: int) -> None:
        self.non_cached_tokens = non_cached_tokens
        self._estimate: CachedTokens | None = None

    def use_cache_estimate(self, estimate: CachedTokens | None) -> None:
        self._estimate = estimate

    def wants_prefill(self, ctx: CycleContext, decode: EndpointState) -> bool:
        total = _prompt_tokens(self._estimate, ctx)
        if total < self.non_cached_tokens:  # cannot reach the threshold: skip hashing
            return False
        # a share, not a count: the index hashes at most maxPrefixBlocksToMatch blocks,
        # so a long prompt cached in full must not look partly uncached
        share = (
            0.0 if self._estimate is None else self._estimate.cached_fraction(ctx, decode.address)
        )
        return total * (1.0 - share) >= self.non_cached_tokens


def uncached_tokens(estimate: CachedTokens | None, ctx: CycleContext, address: str) -> int:
    """The prompt tokens ``address`` does not cache (all of them without an estimate)."""
    share = 0.0 if estimate is None else estimate.cached_fraction(ctx, address)
    return round(_prompt_tokens(estimate, ctx) * (1.0 - share))


class BenefitDecider:
    """Disaggregate when a remote prefill is predicted to cost less than a local one,
    both priced with the scheduler's latency model (``latencyModel`` section):

    * **local**: the decode endpoint prefills the uncached tokens itself (its own
      prefill time), and every decode running there loses the time that prefill's
      chunks add to their steps (:func:`epp.scheduling.latency.interference_s`, with
      ``stepTokens`` per step), weighed by ``stallWeight``;
    * **remote**: the best prefill-capable endpoint's predicted TTFT for those tokens
      (its queue wait + prefill; on a prefill-only endpoint at least the prefill of
      those tokens after every prompt token in flight there), plus the KV transfer
      (``transferMsPerToken`` per uncached token) and one decode step on the decode
      endpoint.

    The decode endpoint's own queue wait comes first either way, so it is left out.
    """

    name = "benefit"

    def __init__(self, step_tokens: int, transfer_ms_per_token: float, stall_weight: float) -> None:
        self.step_tokens = step_tokens
        self.transfer_s_per_token = transfer_ms_per_token / 1000
        self.stall_weight = stall_weight
        self._estimate: CachedTokens | None = None

    def use_cache_estimate(self, estimate: CachedTokens | None) -> None:
        self._estimate = estimate

    def wants_prefill(self, ctx: CycleContext, decode: EndpointState) -> bool:
        local, remote = self.costs(ctx, decode)
        return remote is not None and remote < local

    def costs(self, ctx: CycleContext, decode: EndpointState) -> tuple[float, float | None]:
        """(local, remote) predicted cost in seconds; remote None: no prefill endpoint."""
        uncached = uncached_tokens(self._estimate, ctx, decode.address)
        if uncached <= 0:
            return 0.0, None
        model = ctx.latency.endpoint(decode)
        metrics = ctx.metrics(decode)
        running = 0 if metrics is None or metrics.running is None else round(metrics.running)
        running = max(running, ctx.snapshot.in_flight.get(decode.address, 0))
        if model.slots:  # requests beyond the slots wait: they do not decode
            running = min(running, model.slots)
        step_s = model.decode(running)
        stall = running * interference_s(
            model.prefill.b, step_s, running, uncached, self.step_tokens
        )
        local = model.prefill(uncached) + self.stall_weight * stall
        remote: float | None = None
        for state in ctx.snapshot.endpoints:
            if state.address == decode.address or state.endpoint.role is Role.DECODE:
                continue
            uncached_there = uncached_tokens(self._estimate, ctx, state.address)
            in_flight = ctx.snapshot.in_flight.get(state.address, 0)
            ttft = ctx.latency.predict(state, ctx.metrics(state), in_flight, uncached_there).ttft_s
            if state.endpoint.role is Role.PREFILL:
                # only prefills there, batched by compute rather than queued for slots:
                # this prompt is done after the prompt tokens already in flight there
                backlog = ctx.snapshot.in_flight_tokens.get(state.address, 0)
                ttft = max(ttft, ctx.latency.endpoint(state).prefill(uncached_there + backlog))
            if remote is None or ttft < remote:
                remote = ttft
        if remote is None:
            return local, None
        return local, remote + self.transfer_s_per_token * uncached + step_s


def make_decider(p: Params) -> Decider:
    """The decider named by ``decider`` (parameters beside it in the same mapping)."""
    factories: dict[str, Callable[[], Decider]] = {
        "prefix-based": lambda: PrefixBasedDecider(p.integer("nonCachedTokens", 256, minimum=0)),
        "benefit": lambda: BenefitDecider(
            p.integer("stepTokens", 2048, minimum=1),
            p.number("transferMsPerToken", 0.005, minimum=0.0),
            p.number("stallWeight", 1.0, minimum=0.0),
        ),
        "always": AlwaysDecider,
        "never": NeverDecider,
    }
    name = p.string("decider", "prefix-based")
    if name not in factories:
        raise ConfigError(f"{p.where}.decider: unknown decider {name!r}; use {sorted(factories)}")
    return factories[name]()
