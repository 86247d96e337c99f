"""Prefix-cache affinity: prefer the endpoint that most probably caches the longest
prefix of this prompt (approximate: from what the EPP routed, not what the server
reports)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from epp.common.params import Params
from epp.scheduling.base import CycleContext
from epp.scheduling.columns import CandidateView, FloatArray
from epp.scheduling.loadbound import LoadBound
from epp.scheduling.prefixindex import PrefixIndex, block_hashes
from epp.types import (
    CHARS_PER_TOKEN,
    EndpointMetrics,
    EndpointState,
    InferenceRequest,
    SchedulingResult,
    Snapshot,
)


class PrefixCacheScorer:
    """Score = matched leading blocks / the prompt's blocks (0..1).

    Parameters: ``blockSize`` tokens per block (16; x4 characters), ``maxPrefixBlocksToMatch``
    (256), ``lruCapacityPerServer`` blocks remembered per endpoint (31,250) unless the
    endpoint reports its KV geometry (``cache_config_info``), which then sets it; with
    ``shrinkWithKvUsage`` (default true) less the share its running requests use
    (``kv_usage``), since a busy server evicts cached prefixes to make room.
    The load bound (``loadBound`` 1.25, ``loadBoundKeepsFreeSlot``, ``hotGroupShare``,
    ``coldGroupLoadBound``, ``coldGroupKeepsFreeSlot``, ``groupTokens``:
    :class:`LoadBound`) withholds the score from an endpoint far above the candidates'
    mean load, so a busy prefix spills to a less loaded endpoint, which then caches it
    too: popular prefixes get a second home before their first one queues.
    """

    def __init__(
        self,
        block_tokens: int,
        max_blocks: int,
        capacity: int,
        shrink_with_kv_usage: bool = True,
        load_bound: LoadBound | None = None,
    ) -> None:
        self.block_tokens = block_tokens
        self.load_bound = load_bound or LoadBound()
        self.shrink_with_kv_usage = shrink_with_kv_usage
        # the index hashes characters: a block is blockSize tokens of 4 characters
        self.block_chars = round(block_tokens * CHARS_PER_TOKEN)
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

    def cached_fraction(self, ctx: CycleContext, address: str) -> float:
        """Share of the prompt's hashed blocks ``address`` probably caches (the P/D
        decider asks)."""
        matched = self.matches(ctx).get(address, 0)
        return matched / len(self.hashes(ctx)) if matched else 0.0

    def prompt_tokens(self, ctx: CycleContext) -> int:
        """The prompt's length in tokens: this index knows characters only, so the
        request's (its token ids counted, else characters / the learned characters per
        token)."""
        return ctx.request.prompt_tokens

    def block_tokens_of(self, request: InferenceRequest) -> float:
        """One of this index's blocks (``block_chars`` characters) in the request's
        tokens: ``blockSize`` while a token is 4 characters."""
        return float(self.block_chars / request.chars_per_token)

    def score(
        self, ctx: CycleContext, candidates: Sequence[EndpointState]
    ) -> list[float] | FloatArray:
        matched = self.matches(ctx)
        if not matched:
            return [0.0] * len(candidates)
        if not ctx.vectorize(candidates):
            total = len(self.hashes(ctx))
            scores = [matched.get(s.address, 0) / total for s in candidates]
            return self.load_bound.withhold(ctx, candidates, scores)
        view = ctx.view(candidates)
        array = view.by_address(matched) / len(self.hashes(ctx))
        self.load_bound.withhold_view(ctx, view, array)
        return array

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
        self.load_bound.routed(request)
        # a disaggregated request leaves its KV on the prefill endpoint and, once
        # transferred, on the decode endpoint too
        for target in (result.primary, result.prefill):
            if target is None:
                continue
            state = snapshot.state(target.address)
            metrics = state.metrics if state is not None else None
            capacity = self._capacity(metrics, request.chars_per_token)
            self.index.insert(target.address, hashes, capacity)

    def free_blocks(self, state: EndpointState, chars_per_token: float) -> int:
        """Blocks (of ours) ``state`` can still cache before it must evict some of
        what it is thought to hold (its capacity as :meth:`_capacity` reckons it)."""
        capacity = self._capacity(state.metrics, chars_per_token) or self.index.default_capacity
        return max(capacity - self.index.held.get(state.address, 0), 0)

    def free_blocks_view(self, view: CandidateView, chars_per_token: float) -> FloatArray:
        """:meth:`free_blocks` for every candidate of ``view`` (numpy; the same numbers)."""
        # as on_routed sizes the LRUs: the last report, however old
        fields, rows = view.columns.fields, view.rows
        num_blocks, block_size = fields["num_blocks"][rows], fields["block_size"][rows]
        kv = fields["kv_usage"][rows]
        blocks = num_blocks
        if self.shrink_with_kv_usage:
            blocks = np.where(
                np.isnan(kv), num_blocks, np.floor(num_blocks * (1 - np.clip(kv, 0, 1)))
            )
        ours = np.maximum(np.floor(blocks * block_size * chars_per_token / self.block_chars), 1.0)
        known = (num_blocks > 0) & (block_size > 0)
        capacity = np.where(known, ours, float(self.index.default_capacity))
        free: FloatArray = np.maximum(capacity - view.counts(self.index.held), 0.0)
        return free

    def _capacity(self, m: EndpointMetrics | None, chars_per_token: float) -> int | None:
        """Blocks (of ours) the endpoint can keep cached: its KV geometry (tokens, as
        characters at ``chars_per_token``), less what its running requests occupy (they
        evict cached prefixes first); None = default."""
        if m is None or not m.num_blocks or not m.block_size:
            return None
        blocks = m.num_blocks
        if self.shrink_with_kv_usage and m.kv_usage is not None:
            blocks = int(blocks * (1.0 - min(max(m.kv_usage, 0.0), 1.0)))
        return max(int(blocks * m.block_size * chars_per_token // self.block_chars), 1)


def prefix_cache_scorer(p: Params) -> PrefixCacheScorer:
    return PrefixCacheScorer(
        block_tokens=p.integer("blockSize", 16, minimum=1),
        max_blocks=p.integer("maxPrefixBlocksToMatch", 256, minimum=1),
        capacity=p.integer("lruCapacityPerServer", 31_250, minimum=1),
        shrink_with_kv_usage=p.boolean("shrinkWithKvUsage", True),
        load_bound=LoadBound.from_params(p),
    )
