"""Requests' KV blocks in the pool: prefix hits, allocation, caching, freeing (pure).

The rules of vLLM's V1 ``KVCacheManager`` (``vllm/v1/core/kv_cache_manager.py``) and
its full-attention manager (``vllm/v1/core/single_type_kv_cache_manager.py``) over
:class:`~epp_harness.sim.block_pool.BlockPool`:

- a request's hit is the longest run of its leading full blocks that are cached, over
  at most ``prompt - 1`` tokens (``get_computed_blocks`` sets ``max_cache_hit_length``
  to ``num_tokens - 1``: the last prompt token is always computed, for its logits), so
  a fully cached prompt of whole blocks hits one block less;
- the hit's blocks are referenced first, then the blocks the computed tokens need are
  taken from the free queue (``allocate_slots``), and every block the computed tokens
  fill is cached (``cache_blocks``), generated tokens included;
- a sequence's computed tokens are its prompt, then one more per generated token but
  the last: the newest token is computed by the step that produces the next one, so
  a finished request never computed its last token's KV;
- a finished request frees its blocks tail first (``free`` hands them over in reverse
  order), so its last blocks are evicted before its prefix.

Where the pool has no free block left, the missing blocks are counted as
``overflow`` (used, never cached): vLLM would preempt a request instead.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from epp_harness.sim.block_pool import BlockPool
from epp_harness.sim.prefix_cache import BlockHash, TextKeys, TokenKey, block_hashes


def blocks_for(tokens: int, block_size: int) -> int:
    """KV blocks needed to hold ``tokens`` tokens."""
    return -(-tokens // block_size)


@dataclass(slots=True, eq=False)
class SeqBlocks:
    """One request's block table. ``keys``: its tokens so far (prompt, then generated);
    ``hashes``: the chained hashes of its full blocks; ``cached``: how many leading
    blocks are registered in the pool."""

    keys: list[TokenKey] | TextKeys
    prompt_tokens: int
    hashes: list[BlockHash] = field(default_factory=list)
    blocks: list[int] = field(default_factory=list)
    cached: int = 0
    overflow: int = 0
    hit_tokens: int = 0

    @property
    def computed(self) -> int:
        """Tokens whose KV the sequence has computed (or found cached)."""
        return max(self.prompt_tokens, len(self.keys) - 1)


# what the KV-event publisher hears of a sequence's newly cached run of blocks:
# (hash of the block before the run or None, the run's hashes, its tokens' keys)
OnStored = Callable[[BlockHash | None, Sequence[BlockHash], Sequence[TokenKey]], None]


class KvCache:
    """The block pool and the requests holding blocks in it."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        on_stored: OnStored | None = None,
        on_removed: Callable[[BlockHash], None] | None = None,
    ) -> None:
        self.block_size = block_size
        self.pool = BlockPool(num_blocks, on_removed)
        self._on_stored = on_stored
        self.overflow = 0  # blocks running requests hold beyond the pool

    @property
    def blocks_used(self) -> int:
        """Blocks held by running requests (and holds), overflow included."""
        return self.pool.capacity - self.pool.num_free + self.overflow

    def peek(self, hashes: Sequence[BlockHash]) -> int:
        """Leading blocks of ``hashes`` cached now (no reference taken)."""
        return len(self.pool.longest_hit(hashes))

    def admit(self, prompt: Sequence[TokenKey], *, lookup: bool = True) -> SeqBlocks:
        """Schedule a prompt: find its hit, reference and allocate its blocks, cache its
        full blocks. ``hit_tokens`` is the prompt tokens found cached here."""
        keys = prompt.copy() if isinstance(prompt, TextKeys) else list(prompt)
        seq = SeqBlocks(keys, len(prompt))
        seq.hashes = block_hashes(seq.keys, self.block_size)
        if lookup and seq.prompt_tokens:
            most = (seq.prompt_tokens - 1) // self.block_size
            hit = self.pool.longest_hit(seq.hashes[:most])
            self.pool.touch(hit)
            seq.blocks = hit
            seq.cached = len(hit)
            seq.hit_tokens = len(hit) * self.block_size
        self._fill(seq)
        return seq

    def append(self, seq: SeqBlocks, key: TokenKey) -> None:
        """A generated token: the one before it is now computed (its blocks allocated,
        the block it completes cached)."""
        seq.keys.append(key)
        self._fill(seq)

    def free(self, seq: SeqBlocks) -> None:
        """The request finished (or was abandoned): release its blocks, tail first."""
        self.pool.free(reversed(seq.blocks))
        self.overflow -= seq.overflow
        seq.blocks, seq.overflow = [], 0

    def hold(self, count: int) -> SeqBlocks:
        """``count`` blocks kept outside any request (a prefill's KV awaiting a pull)."""
        seq = SeqBlocks([], 0)
        self._grow(seq, count)
        return seq

    def _fill(self, seq: SeqBlocks) -> None:
        computed = seq.computed
        self._grow(seq, blocks_for(computed, self.block_size))
        full = min(computed // self.block_size, len(seq.blocks))
        if full <= seq.cached:
            return
        if full > len(seq.hashes):  # generated tokens filled a block (admit hashed the prompt)
            seq.hashes = block_hashes(seq.keys, self.block_size, seq.hashes, full)
        first = seq.cached
        for i in range(first, full):
            self.pool.cache(seq.blocks[i], seq.hashes[i])
        seq.cached = full
        if self._on_stored is not None:
            size = self.block_size
            parent = seq.hashes[first - 1] if first else None
            self._on_stored(parent, seq.hashes[first:full], seq.keys[first * size : full * size])

    def _grow(self, seq: SeqBlocks, needed: int) -> None:
        have = len(seq.blocks) + seq.overflow
        if needed <= have:
            return
        taken = self.pool.allocate(needed - have) if not seq.overflow else []
        seq.blocks.extend(taken)
        short = needed - have - len(taken)
        seq.overflow += short
        self.overflow += short
