"""Block-hashed prefix cache: chained block hashes plus an LRU of cached blocks (pure).

A prompt is cut into fixed-size blocks (``block_size`` tokens: ``block_size * 4``
characters of text, or ``block_size`` token ids). Each block's hash covers the previous
block's hash, so a hash identifies the whole prefix up to and including its block, as in
vLLM's automatic prefix caching. Only full blocks are hashed: a partial tail block is
never reusable, so it never counts as cached.

Hashes are blake2b digests, identical in every process (Python's ``hash()`` on str is
salted per process and would make two instances disagree).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence

BlockHash = bytes

_DIGEST_SIZE = 16
# Distinct roots keep a text prompt and a token-id prompt from ever sharing a chain.
_TEXT_ROOT = b"epp-sim/text"
_TOKENS_ROOT = b"epp-sim/token-ids"


def _chain(root: bytes, blocks: Sequence[bytes]) -> list[BlockHash]:
    hashes: list[BlockHash] = []
    prev = hashlib.blake2b(root, digest_size=_DIGEST_SIZE).digest()
    for block in blocks:
        prev = hashlib.blake2b(prev + block, digest_size=_DIGEST_SIZE).digest()
        hashes.append(prev)
    return hashes


def text_block_hashes(text: str, block_chars: int) -> list[BlockHash]:
    """Chained hashes of the full ``block_chars``-character blocks of ``text``."""
    if block_chars < 1:
        raise ValueError("block_chars must be >= 1")
    full = len(text) // block_chars
    blocks = [
        text[i * block_chars : (i + 1) * block_chars].encode("utf-8", "surrogatepass")
        for i in range(full)
    ]
    return _chain(_TEXT_ROOT, blocks)


def token_block_hashes(token_ids: Sequence[int], block_size: int) -> list[BlockHash]:
    """Chained hashes of the full ``block_size``-id blocks of a token-id prompt."""
    if block_size < 1:
        raise ValueError("block_size must be >= 1")
    full = len(token_ids) // block_size
    blocks = [
        ",".join(map(str, token_ids[i * block_size : (i + 1) * block_size])).encode()
        for i in range(full)
    ]
    return _chain(_TOKENS_ROOT, blocks)


class PrefixCache:
    """An LRU set of block hashes whose size the caller bounds on every change.

    The bound is not fixed: the simulator gives the cache whatever KV blocks running
    sequences do not hold, so callers pass the current capacity to ``insert``/``trim``.
    """

    def __init__(self) -> None:
        # Insertion order is recency order: first = least recently used.
        self._blocks: OrderedDict[BlockHash, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, block: object) -> bool:
        return block in self._blocks

    def match(self, hashes: Sequence[BlockHash]) -> int:
        """Number of leading blocks of ``hashes`` that are cached; marks them recently used.

        Chaining makes the first miss final: a later block cannot be valid once an
        earlier one is missing.
        """
        matched = 0
        for h in hashes:
            if h not in self._blocks:
                break
            self._blocks.move_to_end(h)
            matched += 1
        return matched

    def peek(self, hashes: Sequence[BlockHash]) -> int:
        """Number of leading blocks of ``hashes`` that are cached, leaving recency as is."""
        matched = 0
        for h in hashes:
            if h not in self._blocks:
                break
            matched += 1
        return matched

    def insert(self, hashes: Sequence[BlockHash], capacity: int) -> None:
        """Cache a prompt's blocks as most recently used, keeping at most ``capacity``.

        When the prompt alone exceeds the capacity only its leading blocks are kept: a
        tail without its head can never be matched.
        """
        keep = hashes[: max(capacity, 0)]
        for h in keep:
            self._blocks[h] = None
            self._blocks.move_to_end(h)
        self.trim(capacity)

    def trim(self, capacity: int) -> None:
        """Evict least recently used blocks until at most ``capacity`` remain."""
        excess = len(self._blocks) - max(capacity, 0)
        for _ in range(excess):
            self._blocks.popitem(last=False)
