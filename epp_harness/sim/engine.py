"""The simulated engine: FIFO admission, prefix-cache lookups, KV accounting, timing.

At most ``max_num_seqs`` sequences run at once; later ones wait in arrival order. KV
blocks and the prefix cache follow vLLM's block pool (epp_harness.sim.kv_cache): a
running sequence holds the blocks of its computed tokens, every full block is cached,
and a finished sequence's blocks stay cached until allocation evicts them. Latencies
come from the pure functions below (seconds, already multiplied by ``time_scale``), so
they can be checked without an event loop; the clock and sleep are injectable for the
same reason.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import Protocol

from epp_harness.sim.config import SimConfig
from epp_harness.sim.kv_cache import KvCache, SeqBlocks, blocks_for
from epp_harness.sim.prefix_cache import BlockHash, TextKeys, TokenKey, block_hashes
from epp_harness.sim.protocol import GenerationRequest
from epp_harness.sim.responses import token_id, token_text
from epp_harness.sim.steps import StepLoop

__all__ = ["Engine", "EngineCounters", "KvEventSink", "PromptReport", "blocks_for"]


def prefill_seconds(config: SimConfig, uncached_tokens: int) -> float:
    """Prefill time: a fixed overhead plus a per-token cost for the uncached part."""
    ms = config.prefill_overhead_ms + config.prefill_ms_per_token * uncached_tokens
    return ms * config.time_scale / 1000.0


def transfer_seconds(config: SimConfig, tokens: int) -> float:
    """Time to receive ``tokens`` tokens of KV computed by another instance."""
    return config.kv_transfer_ms_per_token * tokens * config.time_scale / 1000.0


def first_token_seconds(config: SimConfig, prompt_tokens: int, cached: int, received: int) -> float:
    """Time from admission to the first token.

    ``cached`` leading prompt tokens are in the local prefix cache, ``received`` leading
    ones arrive from another instance (capped at the prompt by the caller). Received KV
    costs a transfer only for what the local cache lacks; whatever neither covers is
    prefilled here, with the fixed overhead that a fully received prompt skips.
    """
    transferred = max(0, received - cached)
    computed = max(0, prompt_tokens - max(cached, received))
    seconds = transfer_seconds(config, transferred)
    if received == 0 or computed > 0:
        seconds += prefill_seconds(config, computed)
    return seconds


def itl_seconds(config: SimConfig, running: int) -> float:
    """Inter-token latency: a base cost that grows with the number of running sequences."""
    ms = config.decode_ms_per_token + config.itl_ms_per_running_seq * running
    return ms * config.time_scale / 1000.0


def kv_usage(blocks_used: int, kv_blocks: int) -> float:
    """Fraction of KV capacity held by running sequences, capped at 1."""
    return min(1.0, blocks_used / kv_blocks)


@dataclass(slots=True)
class EngineCounters:
    """Monotonic counters since start (what /metrics and /sim/stats report)."""

    requests_total: int = 0
    prompt_tokens_total: int = 0
    generation_tokens_total: int = 0
    request_success_total: int = 0
    prefix_cache_queries_tokens: int = 0
    prefix_cache_hits_tokens: int = 0


@dataclass(slots=True)
class PromptReport:
    """What a request's prefill found, filled in once it has its slot (for ``usage``).

    ``cached_tokens``: leading prompt tokens not prefilled here, because the local prefix
    cache held them or their KV was received from another instance (vLLM's
    ``num_cached_tokens``, which counts both).
    """

    cached_tokens: int = 0


class KvEventSink(Protocol):
    """Hears what the prefix cache stores and evicts (the KV-event publisher)."""

    def stored(
        self,
        parent: BlockHash | None,
        hashes: Sequence[BlockHash],
        token_ids: Sequence[int],
        size: int,
    ) -> None: ...

    def removed(self, block: BlockHash) -> None: ...

    def cleared(self) -> None: ...


def prompt_keys(req: GenerationRequest) -> list[TokenKey] | TextKeys:
    """The per-token keys the prefix cache sees: token ids, or 4-character pieces of a
    text the simulator does not tokenize."""
    if req.prompt_token_ids is not None:
        return list(req.prompt_token_ids)
    return TextKeys(req.prompt_text)


def output_key(req: GenerationRequest, index: int) -> TokenKey:
    """The key of generated token ``index``: the token id the simulator reports for it,
    or its text (4 characters) for a text prompt."""
    return token_id(index) if req.prompt_token_ids is not None else token_text(index)


@dataclass(slots=True, eq=False)
class _Sequence:
    req: GenerationRequest
    arrival: float
    generated: int = 0
    cached_tokens: int = 0
    kv: SeqBlocks | None = None

    @property
    def prompt_tokens(self) -> int:
        return self.req.prompt_tokens


class Engine:
    """Admission, timing and accounting for one simulated instance (one event loop)."""

    def __init__(
        self,
        config: SimConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        on_first_token: Callable[[float], None] | None = None,
        kv_events: KvEventSink | None = None,
    ) -> None:
        self.config = config
        self.counters = EngineCounters()
        self.kv_events = kv_events
        self.kv = KvCache(
            config.kv_blocks,
            config.block_size,
            on_stored=None if kv_events is None else self._announce,
            on_removed=None if kv_events is None else kv_events.removed,
        )
        self._clock = clock
        self._sleep = sleep
        self._on_first_token = on_first_token
        self._running = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        # Step-level batching (chunked prefill, interference), unless turned off.
        self.steps = StepLoop(config, sleep) if config.max_num_batched_tokens else None

    def now(self) -> float:
        """The engine's clock (arrival times passed to ``generate`` come from it)."""
        return self._clock()

    @property
    def running(self) -> int:
        return self._running

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    @property
    def kv_blocks_used(self) -> int:
        return self.kv.blocks_used

    @property
    def kv_cache_usage(self) -> float:
        return kv_usage(self.kv.blocks_used, self.kv.pool.capacity)

    def hold_blocks(self, blocks: int) -> SeqBlocks:
        """Keep ``blocks`` KV blocks allocated outside any running sequence (a prefill's
        KV waiting for a decode to pull it); undo with ``release_blocks``."""
        return self.kv.hold(blocks)

    def release_blocks(self, held: SeqBlocks) -> None:
        self.kv.free(held)

    def reset_prefix_cache(self) -> bool:
        """Drop every cached block (``POST /reset_prefix_cache``); as vLLM, refused
        (False) while a request holds blocks."""
        done = self.kv.pool.reset()
        if done and self.kv_events is not None:
            self.kv_events.cleared()
        return done

    def _announce(
        self, parent: BlockHash | None, hashes: Sequence[BlockHash], keys: Sequence[TokenKey]
    ) -> None:
        """Tell the KV-event sink of a run of newly cached blocks (token ids only: text
        the simulator does not tokenize has none to announce)."""
        if self.kv_events is None or not all(isinstance(k, int) for k in keys):
            return
        ids = [k for k in keys if isinstance(k, int)]
        self.kv_events.stored(parent, hashes, ids, self.config.block_size)

    def block_hashes(self, req: GenerationRequest) -> list[BlockHash]:
        """The chained hashes of the prompt's full KV blocks."""
        return block_hashes(prompt_keys(req), self.config.block_size)

    def cached_blocks(self, hashes: Sequence[BlockHash]) -> int:
        """Leading blocks of ``hashes`` in the prefix cache now."""
        return self.kv.peek(hashes)

    async def generate(
        self,
        req: GenerationRequest,
        *,
        received_tokens: int = 0,
        arrival: float | None = None,
        report: PromptReport | None = None,
    ) -> AsyncGenerator[int, None]:
        """Yield the indexes of ``req.max_tokens`` tokens, each at its simulated time.

        Waits for a running slot first. ``received_tokens`` leading prompt tokens have KV
        computed elsewhere (P/D handoff): they cost a transfer instead of a prefill.
        ``arrival`` (from ``now()``) starts the TTFT clock earlier than this call, e.g.
        before a KV handoff. Close the generator (``contextlib.aclosing``) when
        abandoning it early, e.g. on client disconnect: that frees the slot and the
        sequence's KV blocks at once instead of whenever it is garbage-collected.
        ``report``, when given, gets the prompt tokens that were not prefilled here.
        """
        start = self._clock() if arrival is None else arrival
        seq = _Sequence(req, start)
        self.counters.requests_total += 1
        await self._admit()
        try:
            self._schedule(seq)
            received = min(received_tokens, seq.prompt_tokens)
            if report is not None:
                report.cached_tokens = max(seq.cached_tokens, received)
            pace = (
                self._pace_alone(seq, received, req.max_tokens)
                if self.steps is None
                else self._pace_in_steps(seq, received, req.max_tokens)
            )
            async with aclosing(pace) as due:
                index = 0
                async for _ in due:
                    if index == 0:
                        self.counters.prompt_tokens_total += seq.prompt_tokens
                    self._emit_token(seq)
                    yield index
                    index += 1
            self.counters.request_success_total += 1
        finally:
            if seq.kv is not None:
                self.kv.free(seq.kv)
            self._release_slot()

    async def _pace_alone(
        self, seq: _Sequence, received: int, outputs: int
    ) -> AsyncGenerator[None, None]:
        """Per-request timing (``max_num_batched_tokens`` 0): a prefill time, then an
        inter-token latency from the running count; requests do not slow each other
        down beyond that count."""
        delay = first_token_seconds(self.config, seq.prompt_tokens, seq.cached_tokens, received)
        if delay > 0:
            await self._sleep(delay)
        for index in range(outputs):
            if index:
                delay = itl_seconds(self.config, self._running)
                if delay > 0:
                    await self._sleep(delay)
            yield

    async def _pace_in_steps(
        self, seq: _Sequence, received: int, outputs: int
    ) -> AsyncGenerator[None, None]:
        """Step-level timing (epp_harness.sim.steps): received KV arrives first (the
        sequence holds its slot but no place in the steps meanwhile), then the prompt's
        uncomputed part is prefilled in chunks beside the running decodes."""
        assert self.steps is not None
        transferred = max(0, received - seq.cached_tokens)
        if transferred:
            await self._sleep(transfer_seconds(self.config, transferred))
        computed = max(0, seq.prompt_tokens - max(seq.cached_tokens, received))
        overhead = received == 0 or computed > 0
        async with aclosing(self.steps.pace(computed, outputs, overhead)) as due:
            async for _ in due:
                yield

    def _schedule(self, seq: _Sequence) -> None:
        """A sequence got its slot: look up its prefix, allocate and cache its prompt's
        blocks (vLLM caches a block when it schedules the tokens that fill it)."""
        seq.kv = self.kv.admit(prompt_keys(seq.req))
        seq.cached_tokens = seq.kv.hit_tokens
        self.counters.prefix_cache_queries_tokens += seq.prompt_tokens
        self.counters.prefix_cache_hits_tokens += seq.cached_tokens

    def _emit_token(self, seq: _Sequence) -> None:
        if seq.generated == 0 and self._on_first_token is not None:
            self._on_first_token(self._clock() - seq.arrival)
        assert seq.kv is not None
        self.kv.append(seq.kv, output_key(seq.req, seq.generated))
        seq.generated += 1
        self.counters.generation_tokens_total += 1

    async def _admit(self) -> None:
        if self._running < self.config.max_num_seqs and not self._waiters:
            self._running += 1
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                # The slot was handed over just before the cancel landed: pass it on.
                self._release_slot()
            elif waiter in self._waiters:
                self._waiters.remove(waiter)
            raise

    def _release_slot(self) -> None:
        # Hand the slot straight to the oldest waiter so no newcomer can jump the queue.
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._running -= 1
