"""Approximate prefix-cache index: which endpoint probably holds which prompt blocks.

Prompts are cut into blocks of ``block_chars`` characters (default 64 = 16 tokens x 4
chars); block i's hash is xxhash64 of the block text seeded with block i-1's hash (the
first seeded with the model name's hash), so a hash names a whole prefix. Each endpoint
keeps an LRU of the hashes routed to it (bounded per endpoint); a reverse index maps
hash -> endpoints so a lookup costs O(blocks matched), not O(endpoints x blocks).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from types import MappingProxyType

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
    """Each endpoint holding blocks gets a bit; the reverse index maps a hash to the
    bitmask of its holders. Plain ints, not a set per hash: matching is a few integer
    operations per block, and the index (hundreds of thousands of hashes) holds no
    object the cyclic garbage collector has to walk."""

    def __init__(self, default_capacity: int) -> None:
        self.default_capacity = default_capacity
        self._lru: dict[str, OrderedDict[int, None]] = {}
        self._holders: dict[int, int] = {}  # hash -> bitmask of endpoints holding it
        self._bit: dict[str, int] = {}  # address -> its bit (1 << index)
        self._address: dict[int, str] = {}  # bit -> address
        self._free: list[int] = []  # bits of forgotten endpoints, reused first
        # address -> blocks it holds (len of its LRU), kept in step for fast lookups
        self._held: dict[str, int] = {}
        self._held_view = MappingProxyType(self._held)

    def match(self, hashes: Sequence[int]) -> dict[str, int]:
        """address -> number of leading blocks of ``hashes`` it holds (0s omitted)."""
        if not hashes:
            return {}
        holders_of = self._holders
        alive = holders_of.get(hashes[0], 0)
        if not alive:
            return {}
        matched: dict[str, int] = {}
        for i in range(1, len(hashes)):
            holders = holders_of.get(hashes[i], 0)
            if holders == alive:  # the usual case: the same holders (no new int made)
                continue
            still = alive & holders
            if still == alive:  # nobody drops
                continue
            for gone in self._addresses(alive ^ still):
                matched[gone] = i
            alive = still
            if not alive:
                break
        for address in self._addresses(alive):
            matched[address] = len(hashes)
        return matched

    def insert(self, address: str, hashes: Sequence[int], capacity: int | None = None) -> None:
        """Record that ``address`` now holds ``hashes``; evict its least recently used
        blocks beyond ``capacity`` (default: the index's default)."""
        lru = self._lru.get(address)
        if lru is None:
            lru = self._lru[address] = OrderedDict()
            bit = 1 << self._free.pop() if self._free else 1 << len(self._bit)
            self._bit[address], self._address[bit] = bit, address
        bit = self._bit[address]
        holders = self._holders
        for h in hashes:
            if h in lru:
                lru.move_to_end(h)
            else:
                lru[h] = None
                holders[h] = holders.get(h, 0) | bit
        limit = max(capacity or self.default_capacity, 1)
        while len(lru) > limit:
            old, _ = lru.popitem(last=False)
            self._drop(old, bit)
        self._held[address] = len(lru)

    def retain(self, addresses: set[str]) -> None:
        """Forget endpoints not in ``addresses`` (removed from the pool)."""
        for address in [a for a in self._lru if a not in addresses]:
            bit = self._bit.pop(address)
            del self._held[address]
            for h in self._lru.pop(address):
                self._drop(h, bit)
            del self._address[bit]
            self._free.append(bit.bit_length() - 1)  # no hash has the bit any more

    @property
    def held(self) -> Mapping[str, int]:
        """address -> blocks it is thought to hold (absent: none); a live read-only view."""
        return self._held_view

    def size(self) -> int:
        """Blocks held across all endpoints (memory is proportional to this)."""
        return sum(self._held.values())

    def _drop(self, h: int, bit: int) -> None:
        mask = self._holders.get(h, 0) & ~bit
        if mask:
            self._holders[h] = mask
        else:
            self._holders.pop(h, None)

    def _addresses(self, mask: int) -> list[str]:
        """The addresses whose bits are set in ``mask``."""
        found = []
        while mask:
            low = mask & -mask
            found.append(self._address[low])
            mask ^= low
        return found
