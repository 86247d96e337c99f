"""Deciders: given the decode endpoint the scheduler chose, is a separate prefill worth
it? Pure functions of the cycle, registered by name."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from epp.scheduling.base import CycleContext
from epp.scheduling.params import ConfigError, Params
from epp.types import EndpointState


class CachedTokens(Protocol):
    """Something that estimates which share of the prompt an endpoint caches (the
    prefix-cache scorer: matched blocks / hashed blocks, 0..1)."""

    def cached_fraction(self, ctx: CycleContext, address: str) -> float: ...


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
        total = ctx.request.prompt_tokens
        if total < self.non_cached_tokens:  # cannot reach the threshold: skip hashing
            return False
        # a share, not a count: the index hashes at most maxPrefixBlocksToMatch blocks,
        # so a long prompt cached in full must not look partly uncached
        share = (
            0.0 if self._estimate is None else self._estimate.cached_fraction(ctx, decode.address)
        )
        return total * (1.0 - share) >= self.non_cached_tokens


def make_decider(p: Params) -> Decider:
    """The decider named by ``decider`` (parameters beside it in the same mapping)."""
    factories: dict[str, Callable[[], Decider]] = {
        "prefix-based": lambda: PrefixBasedDecider(p.integer("nonCachedTokens", 256, minimum=0)),
        "always": AlwaysDecider,
        "never": NeverDecider,
    }
    name = p.string("decider", "prefix-based")
    if name not in factories:
        raise ConfigError(f"{p.where}.decider: unknown decider {name!r}; use {sorted(factories)}")
    return factories[name]()
