"""Chained block hashing of per-token keys (plain data)."""

from __future__ import annotations

import random

from epp_harness.sim.chunk_tokenizer import token_keys
from epp_harness.sim.prefix_cache import (
    TextKeys,
    block_hashes,
    text_block_hashes,
    token_block_hashes,
)

BLOCK = 64  # 16 tokens x 4 chars


def test_hashes_are_fixed_values_so_every_process_agrees() -> None:
    # A golden value: Python's salted str hash() would differ between processes.
    assert text_block_hashes("a" * 64, BLOCK)[0].hex() == "1963726073a7371190e63df9bb835ea0"
    assert token_block_hashes(list(range(16)), 16)[0].hex() == "7bdc084d6632133ac7b8f9eca317ebab"


def test_only_full_blocks_are_hashed() -> None:
    assert text_block_hashes("x" * 60, BLOCK) == []
    assert len(text_block_hashes("x" * 61, BLOCK)) == 1  # 16 simulated tokens
    assert len(text_block_hashes("x" * 64, BLOCK)) == 1
    assert len(text_block_hashes("x" * 188, BLOCK)) == 2  # 47 tokens
    assert len(token_block_hashes(list(range(47)), 16)) == 2


def test_same_prefix_gives_same_hashes_and_a_divergent_block_breaks_the_chain() -> None:
    a, b, c, d = ("a" * BLOCK, "b" * BLOCK, "c" * BLOCK, "d" * BLOCK)
    first = text_block_hashes(a + b + c + d, BLOCK)
    second = text_block_hashes(a + b + "X" * BLOCK + d, BLOCK)
    assert first == text_block_hashes(a + b + c + d + "tail", BLOCK)
    assert first[:2] == second[:2]
    assert first[2] != second[2]
    # Same text in block 3, but its hash covers the different block before it.
    assert first[3] != second[3]


def test_a_block_hash_depends_on_its_position() -> None:
    hashes = text_block_hashes("z" * BLOCK * 3, BLOCK)
    assert len(set(hashes)) == 3


def test_text_and_token_id_prompts_never_share_hashes() -> None:
    assert not set(text_block_hashes("1," * 32, BLOCK)) & set(token_block_hashes([1] * 32, 16))


def test_text_keys_are_four_characters_and_hash_as_the_text_does() -> None:
    assert token_keys("abcdefghij") == ["abcd", "efgh", "ij"]
    assert block_hashes(token_keys("q" * 128), 16) == text_block_hashes("q" * 128, BLOCK)


def test_known_hashes_are_extended_not_recomputed() -> None:
    ids = list(range(64))
    head = token_block_hashes(ids[:32], 16)
    assert block_hashes(ids, 16, head) == token_block_hashes(ids, 16)


def test_text_keys_hash_and_read_as_their_pieces() -> None:
    rng = random.Random(5)
    for _ in range(40):
        text = "".join(rng.choice("ab\u00e9\U0001f600\n") for _ in range(rng.randrange(1, 300)))
        generated = ["".join(rng.choice("xyz") for _ in range(4)) for _ in range(rng.randrange(9))]
        lazy, pieces = TextKeys(text), token_keys(text)
        for key in generated:
            lazy.append(key)
            pieces.append(key)
        assert len(lazy) == len(pieces) and list(lazy) == pieces and lazy[-1] == pieces[-1]
        assert lazy[2:7] == pieces[2:7]
        for size in (1, 2, 3, 16):
            assert block_hashes(lazy, size) == block_hashes(pieces, size)
            blocks = len(pieces) // size
            known = block_hashes(pieces, size)[: blocks // 2]
            assert block_hashes(lazy, size, known, blocks) == block_hashes(pieces, size)
