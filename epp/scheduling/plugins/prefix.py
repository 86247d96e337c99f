"""Prefix-cache affinity: prefer the endpoint that most probably caches the longest
prefix of this prompt (approximate: from what the EPP routed, not what the server
reports)."""

from __future__ import annotations

from collections.abc import Sequence

from epp.scheduling.base import CycleContext
from epp.scheduling.params import Params
from epp.scheduling.prefixindex import PrefixIndex, block_hashes
from epp.types import EndpointState, InferenceRequest, SchedulingResult, Snapshot

CHARS_PER_TOKEN = 4


class PrefixCacheScorer:
    """Score = matched leading blocks / the prompt's blocks (0..1).

    Parameters: ``blockSize`` tokens per block (16; x4 characters), ``maxPrefixBlocksToMatch``
    (256), ``lruCapacityPerServer`` blocks remembered per endpoint (31,250) unless the
    endpoint reports its KV geometry (``cache_config_info``), which then sets it.
    """

    def __init__(self, block_tokens: int, max_blocks: int, capacity: int) -> None:
        self.block_tokens = block_tokens
        self.block_chars = block_tokens * CHARS_PER_TOKEN
        self.max_blocks = max_blocks
        self.index = PrefixIndex(capacity)
        self._version = -1
        # the last request scored and its hashes, so on_routed need not hash again
        self._last: tuple[InferenceRequest | None, list[int]] = (None, [])

    def hashes(self, ctx: CycleContext) -> list[int]:
        """The request's block hashes, computed once per cycle (shared across profiles)."""
        key = f"prefix-hashes/{self.block_chars}/{self.max_blocks}"
        cached = ctx.cache.get(key)
        if cached is None:
            r = ctx.request
            cached = block_hashes(r.model or "", r.prompt, self.block_chars, self.max_blocks)
            ctx.cache[key] = cached
            self._last = (r, cached)
        result: list[int] = cached
        return result

    def matches(self, ctx: CycleContext) -> dict[str, int]:
        """address -> leading blocks of the prompt it probably caches (once per cycle)."""
        key = f"prefix-matches/{id(self)}"
        cached = ctx.cache.get(key)
        if cached is None:
            hashes = self.hashes(ctx)
            cached = self.index.match(hashes) if hashes else {}
            ctx.cache[key] = cached
        result: dict[str, int] = cached
        return result

    def cached_tokens(self, ctx: CycleContext, address: str) -> int:
        """Estimated prompt tokens ``address`` already caches (the P/D decider asks)."""
        return self.matches(ctx).get(address, 0) * self.block_tokens

    def score(self, ctx: CycleContext, candidates: Sequence[EndpointState]) -> list[float]:
        matched = self.matches(ctx)
        if not matched:
            return [0.0] * len(candidates)
        total = len(self.hashes(ctx))
        return [matched.get(s.address, 0) / total for s in candidates]

    def on_routed(
        self, request: InferenceRequest, result: SchedulingResult, snapshot: Snapshot
    ) -> None:
        if snapshot.version != self._version:  # membership changed: forget removed ones
            self._version = snapshot.version
            self.index.retain({s.address for s in snapshot.endpoints})
        last, hashes = self._last
        self._last = (None, [])
        if last is not request:  # scored in this cycle? then reuse its hashes
            hashes = block_hashes(
                request.model or "", request.prompt, self.block_chars, self.max_blocks
            )
        if not hashes:
            return
        # a disaggregated request leaves its KV on the prefill endpoint and, once
        # transferred, on the decode endpoint too
        for target in (result.primary, result.prefill):
            if target is None:
                continue
            capacity = None
            state = snapshot.state(target.address)
            m = state.metrics if state is not None else None
            if m is not None and m.num_blocks and m.block_size:
                capacity = m.num_blocks * m.block_size // self.block_tokens
            self.index.insert(target.address, hashes, capacity)


def prefix_cache_scorer(p: Params) -> PrefixCacheScorer:
    return PrefixCacheScorer(
        block_tokens=p.integer("blockSize", 16, minimum=1),
        max_blocks=p.integer("maxPrefixBlocksToMatch", 256, minimum=1),
        capacity=p.integer("lruCapacityPerServer", 31_250, minimum=1),
    )
