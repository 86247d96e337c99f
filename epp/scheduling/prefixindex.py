"""Approximate prefix-cache index: which endpoint probably holds which prompt blocks.

Prompts are cut into blocks of ``block_chars`` characters (default 64 = 16 tokens x 4
chars); block i's hash is xxhash64 of the block text seeded with block i-1's hash (the
first seeded with the model name's hash), so a hash names a whole prefix. Each endpoint
keeps an LRU of the hashes routed to it (bounded per endpoint); a reverse index maps
hash -> endpoints so a lookup costs O(blocks matched), not O(endpoints x blocks).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import xxhash


def block_hashes(model: str, prompt: str, block_chars: int, max_blocks: int) -> list[int]:
    """Chained hashes of the prompt's first ``max_blocks`` full blocks."""
    n = min(len(prompt) // block_chars, max_blocks)
    hashes: list[int] = []
    prev = xxhash.xxh64_intdigest(model.encode())
    size = n * block_chars
    data = prompt[:size].encode()
    h64 = xxhash.xxh64_intdigest
    append = hashes.append
    if len(data) == size:  # one byte per character: cut the bytes (the common case)
        for start in range(0, size, block_chars):
            prev = h64(data[start : start + block_chars], prev)
            append(prev)
        return hashes
    # characters -> bytes changed lengths; cut by characters for stable blocks
    for start in range(0, size, block_chars):
        prev = h64(prompt[start : start + block_chars].encode(), prev)
        append(prev)
    return hashes


class PrefixIndex:
    def __init__(self, default_capacity: int) -> None:
        self.default_capacity = default_capacity
        self._lru: dict[str, OrderedDict[int, None]] = {}
        self._holders: dict[int, set[str]] = {}

    def match(self, hashes: Sequence[int]) -> dict[str, int]:
        """address -> number of leading blocks of ``hashes`` it holds (0s omitted)."""
        if not hashes:
            return {}
        alive = self._holders.get(hashes[0])
        if not alive:
            return {}
        alive = set(alive)
        matched: dict[str, int] = {}
        holders_of = self._holders
        for i in range(1, len(hashes)):
            holders = holders_of.get(hashes[i])
            if holders is not None and alive <= holders:  # the usual case: nobody drops
                continue
            still = alive & holders if holders else set()
            for gone in alive - still:
                matched[gone] = i
            alive = still
            if not alive:
                break
        for address in alive:
            matched[address] = len(hashes)
        return matched

    def insert(self, address: str, hashes: Sequence[int], capacity: int | None = None) -> None:
        """Record that ``address`` now holds ``hashes``; evict its least recently used
        blocks beyond ``capacity`` (default: the index's default)."""
        lru = self._lru.get(address)
        if lru is None:
            lru = self._lru[address] = OrderedDict()
        for h in hashes:
            if h in lru:
                lru.move_to_end(h)
            else:
                lru[h] = None
                self._holders.setdefault(h, set()).add(address)
        limit = max(capacity or self.default_capacity, 1)
        while len(lru) > limit:
            old, _ = lru.popitem(last=False)
            self._drop(old, address)

    def retain(self, addresses: set[str]) -> None:
        """Forget endpoints not in ``addresses`` (removed from the pool)."""
        for address in [a for a in self._lru if a not in addresses]:
            for h in self._lru.pop(address):
                self._drop(h, address)

    def size(self) -> int:
        """Blocks held across all endpoints (memory is proportional to this)."""
        return sum(len(lru) for lru in self._lru.values())

    def _drop(self, h: int, address: str) -> None:
        holders = self._holders.get(h)
        if holders is not None:
            holders.discard(address)
            if not holders:
                del self._holders[h]
