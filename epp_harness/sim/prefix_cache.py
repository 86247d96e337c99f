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
from collections.abc import Iterable, Sequence
from typing import overload

from epp_harness.sim.chunk_tokenizer import count_tokens, token_keys
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
        # a text block's keys are all text (its prompt's pieces, then generated tokens')
        return "".join(keys).encode("utf-8", "surrogatepass")  # type: ignore[arg-type]
    return ",".join(map(str, keys)).encode()


class TextKeys(Sequence[str]):
    """The keys of a text prompt the simulator does not tokenize (its 4-character
    pieces, :func:`~epp_harness.sim.chunk_tokenizer.token_keys`), then its generated
    tokens' keys, without a string made per piece: a 220 KB prompt is 56,320 pieces,
    and making them was most of the simulator's CPU for such a request. A block's hash
    reads the text the block covers (:meth:`joined`), which is its pieces joined, so the
    hashes are those of the pieces."""

    __slots__ = ("_generated", "_pieces", "text")

    def __init__(self, text: str, generated: Iterable[str] = ()) -> None:
        self.text = text
        self._pieces = count_tokens(text)
        self._generated = list(generated)

    def __len__(self) -> int:
        return self._pieces + len(self._generated)

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> list[str]: ...

    def __getitem__(self, index: int | slice) -> str | list[str]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        i = index + len(self) if index < 0 else index
        if not 0 <= i < len(self):
            raise IndexError(index)
        if i < self._pieces:
            return self.text[i * CHARS_PER_TOKEN : (i + 1) * CHARS_PER_TOKEN]
        return self._generated[i - self._pieces]

    def append(self, key: TokenKey) -> None:
        """A generated token's key (text, as every key of a text prompt's sequence;
        str() as a block's hash would join it)."""
        self._generated.append(str(key))

    def copy(self) -> TextKeys:
        return TextKeys(self.text, self._generated)

    def joined(self, start: int, stop: int) -> str:
        """Keys ``start`` to ``stop - 1`` joined (0 <= start <= stop <= len(self))."""
        pieces = self._pieces
        head = self.text[start * CHARS_PER_TOKEN : min(stop, pieces) * CHARS_PER_TOKEN]
        if stop <= pieces:
            return head
        return head + "".join(self._generated[max(start - pieces, 0) : stop - pieces])


def block_hash(parent: BlockHash | None, keys: Sequence[TokenKey]) -> BlockHash:
    """The hash of one full block of ``keys`` whose previous block hashed to ``parent``
    (None: the first block)."""
    if parent is None:
        parent = _ROOTS[str if keys and isinstance(keys[0], str) else int]
    return _digest(parent + _block_bytes(keys))


def block_hashes(
    keys: Sequence[TokenKey],
    block_size: int,
    known: Sequence[BlockHash] = (),
    blocks: int | None = None,
) -> list[BlockHash]:
    """Chained hashes of the full ``block_size``-key blocks of ``keys`` (the first
    ``blocks`` of them, if given); ``known`` are the hashes of its leading blocks
    already computed (extended, not recomputed)."""
    if block_size < 1:
        raise ValueError("block_size must be >= 1")
    hashes = list(known)
    full = len(keys) // block_size if blocks is None else blocks
    if isinstance(keys, TextKeys):  # a block's text, not its pieces: the same bytes
        for i in range(len(hashes), full):
            chain = hashes[-1] if hashes else _ROOTS[str]
            text = keys.joined(i * block_size, (i + 1) * block_size)
            hashes.append(_digest(chain + text.encode("utf-8", "surrogatepass")))
        return hashes
    for i in range(len(hashes), full):
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
