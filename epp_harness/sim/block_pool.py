"""The KV block pool, block for block as vLLM's V1 ``BlockPool`` keeps it (pure).

``num_blocks`` physical blocks; block 0 is reserved, as vLLM reserves its null block
(``BlockPool.__init__`` takes it off the free queue), so ``num_blocks - 1`` hold KV.
Every block not referenced by a running request sits in the *free queue* (vLLM's
``FreeKVCacheBlockQueue`` in ``vllm/v1/core/kv_cache_utils.py``), in eviction order:
at first every block in id order; a freed cached block joins the tail, a freed
uncached one (a request's partial last block) the head, to be reused first; an
allocation takes the head (``BlockPool.get_new_blocks``), and when that block was
cached its hash is dropped then, and only then (``_maybe_evict_cached_block``). So a
cached block stays reusable until it is the least recently freed cached block and
somebody needs a block no uncached free block can give.

A full block gets its hash once a request has filled it (``cache_full_blocks``); a
hash may name several blocks (vLLM does not de-duplicate: a request that recomputes a
cached block caches its copy too), and a lookup takes the first one cached. A hit
(``touch``) takes a free block off the free queue and references it; freeing a
reference returns it to the tail when no request holds it any more (``free_blocks``).

``on_removed`` hears of every cached block whose hash is dropped (the KV events'
``BlockRemoved``, one per block as vLLM sends them).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence

from epp_harness.sim.prefix_cache import BlockHash

NULL_BLOCK = 0


class BlockPool:
    """Physical KV blocks: reference counts, the free queue and the hash index."""

    def __init__(
        self, num_blocks: int, on_removed: Callable[[BlockHash], None] | None = None
    ) -> None:
        if num_blocks < 2:
            raise ValueError("a block pool needs at least 2 blocks (one is reserved)")
        self.num_blocks = num_blocks
        self._on_removed = on_removed
        # the free queue: first = the next to be allocated (and evicted if cached)
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(1, num_blocks))
        self._refs = [0] * num_blocks
        self._hash: dict[int, BlockHash] = {}
        # hash -> the blocks holding it, in the order they were cached
        self._index: dict[BlockHash, dict[int, None]] = {}

    # -- queries -----------------------------------------------------------------------
    @property
    def capacity(self) -> int:
        """Blocks that can hold KV (all but the reserved one)."""
        return self.num_blocks - 1

    @property
    def num_free(self) -> int:
        """Blocks no request references (cached or not): what allocation can take."""
        return len(self._free)

    @property
    def num_cached(self) -> int:
        """Blocks holding a hash, referenced or free."""
        return len(self._hash)

    def free_queue(self) -> list[int]:
        """The free blocks in eviction order (tests and debugging)."""
        return list(self._free)

    def hash_of(self, block: int) -> BlockHash | None:
        return self._hash.get(block)

    def refs(self, block: int) -> int:
        return self._refs[block]

    def cached_block(self, block_hash: BlockHash) -> int | None:
        """The block a lookup of ``block_hash`` finds (the first cached), if any."""
        blocks = self._index.get(block_hash)
        return next(iter(blocks)) if blocks else None

    def longest_hit(self, hashes: Sequence[BlockHash]) -> list[int]:
        """The blocks of the longest run of leading ``hashes`` that are cached (vLLM's
        ``find_longest_cache_hit``: chaining makes the first miss final)."""
        hit: list[int] = []
        for h in hashes:
            block = self.cached_block(h)
            if block is None:
                break
            hit.append(block)
        return hit

    # -- changes -----------------------------------------------------------------------
    def touch(self, blocks: Iterable[int]) -> None:
        """Reference cache-hit blocks; a free one leaves the free queue (``touch``)."""
        for block in blocks:
            if self._refs[block] == 0:
                del self._free[block]
            self._refs[block] += 1

    def allocate(self, count: int) -> list[int]:
        """Take ``count`` blocks from the head of the free queue, dropping the hash of
        any cached one; fewer when the queue runs dry (the caller counts the rest)."""
        taken: list[int] = []
        while len(taken) < count and self._free:
            block, _ = self._free.popitem(last=False)
            self._evict(block)
            self._refs[block] = 1
            taken.append(block)
        return taken

    def cache(self, block: int, block_hash: BlockHash) -> None:
        """Register a block a request has filled under its hash."""
        assert block not in self._hash, "a block is cached once"
        self._hash[block] = block_hash
        self._index.setdefault(block_hash, {})[block] = None

    def free(self, ordered: Iterable[int]) -> None:
        """Drop one reference from each block, in eviction order. The blocks nobody
        holds any more rejoin the free queue (``free_blocks``): cached ones at its tail,
        in that order, to be evicted least recently freed first; uncached ones (a
        partial last block) at its head, in that order, to be reused first."""
        uncached: list[int] = []
        for block in ordered:
            self._refs[block] -= 1
            assert self._refs[block] >= 0, f"block {block} freed twice"
            if self._refs[block] == 0:
                if block in self._hash:
                    self._free[block] = None
                else:
                    uncached.append(block)
        for block in reversed(uncached):
            self._free[block] = None
            self._free.move_to_end(block, last=False)

    def reset(self) -> bool:
        """Drop every hash (vLLM's ``reset_prefix_cache``); refused (False) while any
        request holds a block, as vLLM refuses it."""
        if len(self._free) != self.capacity:
            return False
        self._hash.clear()
        self._index.clear()
        return True

    def _evict(self, block: int) -> None:
        block_hash = self._hash.pop(block, None)
        if block_hash is None:
            return
        holders = self._index[block_hash]
        del holders[block]
        if not holders:
            del self._index[block_hash]
        if self._on_removed is not None:
            self._on_removed(block_hash)
