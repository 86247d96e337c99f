"""Prefix cache: chained block hashing and the LRU of cached blocks (plain data)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from epp_harness.sim.prefix_cache import PrefixCache, text_block_hashes, token_block_hashes

BLOCK = 64  # 16 tokens x 4 chars


def test_hashes_are_fixed_values_so_every_process_agrees() -> None:
    # A golden value: Python's salted str hash() would differ between processes.
    assert text_block_hashes("a" * 64, BLOCK)[0].hex() == "1963726073a7371190e63df9bb835ea0"
    assert token_block_hashes(list(range(16)), 16)[0].hex() == "7bdc084d6632133ac7b8f9eca317ebab"


def test_only_full_blocks_are_hashed() -> None:
    assert text_block_hashes("x" * 63, BLOCK) == []
    assert len(text_block_hashes("x" * 64, BLOCK)) == 1
    assert len(text_block_hashes("x" * 200, BLOCK)) == 3
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


def test_match_is_longest_cached_prefix() -> None:
    cache = PrefixCache()
    a = text_block_hashes("a" * BLOCK * 4, BLOCK)
    cache.insert(a, capacity=100)
    assert cache.match(a) == 4
    assert cache.match(text_block_hashes("a" * BLOCK * 2 + "b" * BLOCK * 2, BLOCK)) == 2
    assert cache.match(text_block_hashes("b" * BLOCK * 4, BLOCK)) == 0
    # A later block present without its predecessors does not count.
    assert cache.match([b"missing", *a[1:]]) == 0
    assert cache.match([]) == 0


def test_lru_evicts_least_recently_used_first() -> None:
    cache = PrefixCache()
    old, mid, new = (text_block_hashes(ch * BLOCK, BLOCK) for ch in "omn")
    cache.insert(old, capacity=2)
    cache.insert(mid, capacity=2)
    assert cache.match(old) == 1  # touching `old` makes `mid` the least recent
    cache.insert(new, capacity=2)
    assert len(cache) == 2
    assert old[0] in cache and new[0] in cache and mid[0] not in cache


def test_trim_shrinks_to_capacity() -> None:
    cache = PrefixCache()
    cache.insert(text_block_hashes("q" * BLOCK * 10, BLOCK), capacity=10)
    cache.trim(4)
    assert len(cache) == 4
    cache.trim(-3)
    assert len(cache) == 0


def test_prompt_larger_than_capacity_keeps_its_head() -> None:
    cache = PrefixCache()
    hashes = text_block_hashes("h" * BLOCK * 8, BLOCK)
    cache.insert(hashes, capacity=3)
    assert len(cache) == 3
    assert cache.match(hashes) == 3


@given(
    st.lists(
        st.tuples(st.lists(st.integers(0, 20), max_size=12), st.integers(0, 8)),
        max_size=30,
    )
)
def test_size_never_exceeds_capacity(ops: list[tuple[list[int], int]]) -> None:
    cache = PrefixCache()
    for ids, capacity in ops:
        cache.insert(token_block_hashes(ids, 2), capacity)
        assert len(cache) <= capacity
