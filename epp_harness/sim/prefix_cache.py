"""Chained block hashes of a sequence of per-token keys (pure).

A sequence is a list of per-token keys: token ids (``int``) for token-id prompts and
tokenized ones, or, for text the simulator does not tokenize, one ``str`` of 4
characters per simulated token (its tokenizer rule). It is cut into blocks of
``block_size`` keys; each block's hash covers the previous block's hash, so a hash
identifies the whole prefix up to and including its block, as in vLLM's automatic
prefix caching (``hash_block_tokens`` in ``vllm/v1/core/kv_cache_utils.py``). Only full
blocks are hashed: a partial tail block is never reusable.

Hashes are blake2b digests, identical in every process (Python's ``hash()`` on str is
salted per process and would make two instances disagree).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from epp_harness.sim.chunk_tokenizer import token_keys
from epp_harness.sim.config import CHARS_PER_TOKEN

BlockHash = bytes
TokenKey = int | str

_DIGEST_SIZE = 16
# Distinct roots keep a text prompt and a token-id prompt from ever sharing a chain.
_TEXT_ROOT = b"epp-sim/text"
_TOKENS_ROOT = b"epp-sim/token-ids"


def _digest(data: bytes) -> BlockHash:
    return hashlib.blake2b(data, digest_size=_DIGEST_SIZE).digest()


_ROOTS = {int: _digest(_TOKENS_ROOT), str: _digest(_TEXT_ROOT)}


def _block_bytes(keys: Sequence[TokenKey]) -> bytes:
    if keys and isinstance(keys[0], str):
        return "".join(map(str, keys)).encode("utf-8", "surrogatepass")
    return ",".join(map(str, keys)).encode()


def block_hash(parent: BlockHash | None, keys: Sequence[TokenKey]) -> BlockHash:
    """The hash of one full block of ``keys`` whose previous block hashed to ``parent``
    (None: the first block)."""
    if parent is None:
        parent = _ROOTS[str if keys and isinstance(keys[0], str) else int]
    return _digest(parent + _block_bytes(keys))


def block_hashes(
    keys: Sequence[TokenKey], block_size: int, known: Sequence[BlockHash] = ()
) -> list[BlockHash]:
    """Chained hashes of the full ``block_size``-key blocks of ``keys``; ``known`` are
    the hashes of its leading blocks already computed (extended, not recomputed)."""
    if block_size < 1:
        raise ValueError("block_size must be >= 1")
    hashes = list(known)
    for i in range(len(hashes), len(keys) // block_size):
        parent = hashes[-1] if hashes else None
        hashes.append(block_hash(parent, keys[i * block_size : (i + 1) * block_size]))
    return hashes


def text_block_hashes(text: str, block_chars: int) -> list[BlockHash]:
    """Chained hashes of the full ``block_chars``-character blocks of ``text``."""
    if block_chars < 1 or block_chars % CHARS_PER_TOKEN:
        raise ValueError(f"block_chars must be a positive multiple of {CHARS_PER_TOKEN}")
    return block_hashes(token_keys(text), block_chars // CHARS_PER_TOKEN)


def token_block_hashes(token_ids: Sequence[int], block_size: int) -> list[BlockHash]:
    """Chained hashes of the full ``block_size``-id blocks of a token-id prompt."""
    return block_hashes(token_ids, block_size)
