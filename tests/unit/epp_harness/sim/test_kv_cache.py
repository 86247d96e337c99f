"""The KV block pool and its requests, as vLLM's V1 block pool keeps them (plain data):
what a request hits, what it caches, what is evicted and in which order."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from epp_harness.sim.block_pool import BlockPool
from epp_harness.sim.kv_cache import KvCache, SeqBlocks
from epp_harness.sim.prefix_cache import BlockHash, TokenKey, token_block_hashes

BS = 4


def ids(tag: int, blocks: float) -> list[int]:
    """A prompt of distinct token ids, ``blocks`` blocks long."""
    return [tag * 1000 + i for i in range(int(blocks * BS))]


class Events:
    def __init__(self) -> None:
        self.stored: list[tuple[BlockHash | None, list[BlockHash], list[TokenKey]]] = []
        self.removed: list[BlockHash] = []

    def on_stored(
        self, parent: BlockHash | None, hashes: Sequence[BlockHash], keys: Sequence[TokenKey]
    ) -> None:
        self.stored.append((parent, list(hashes), list(keys)))


def cache(num_blocks: int) -> tuple[KvCache, Events]:
    events = Events()
    kv = KvCache(num_blocks, BS, on_stored=events.on_stored, on_removed=events.removed.append)
    return kv, events


def serve(kv: KvCache, prompt: list[int], outputs: int = 1) -> SeqBlocks:
    """One request alone: admitted, ``outputs`` tokens generated, freed."""
    seq = kv.admit(prompt)
    for i in range(outputs):
        kv.append(seq, 900_000 + i)
    kv.free(seq)
    return seq


def hit(kv: KvCache, prompt: list[int]) -> int:
    """Tokens a request for ``prompt`` would find cached (without running it)."""
    most = (len(prompt) - 1) // BS
    return kv.peek(token_block_hashes(prompt, BS)[:most]) * BS


def test_a_full_hit_still_computes_the_last_token() -> None:
    kv, _ = cache(20)
    aligned, ragged = ids(1, 3), ids(2, 3.5)
    serve(kv, aligned)
    serve(kv, ragged)
    # a prompt of whole blocks hits one block less; a ragged one hits all full blocks
    assert serve(kv, aligned).hit_tokens == 2 * BS
    assert serve(kv, ragged).hit_tokens == 3 * BS
    assert serve(kv, aligned[:1]).hit_tokens == 0


def test_a_recomputed_block_is_cached_again_as_a_second_copy() -> None:
    kv, events = cache(20)
    prompt = ids(1, 2)
    serve(kv, prompt)
    events.stored.clear()
    serve(kv, prompt)  # block 2 is recomputed into a new block, and cached too
    hashes = token_block_hashes(prompt, BS)
    assert events.stored == [(hashes[0], [hashes[1]], prompt[BS:])]
    assert kv.pool.num_cached == 3
    assert kv.pool.cached_block(hashes[1]) == 2  # a lookup finds the first copy


def test_an_exact_repeat_hits_the_requests_unique_blocks() -> None:
    kv, _ = cache(20)
    shared = ids(1, 2)
    question = shared + ids(2, 1.5)
    serve(kv, question)
    serve(kv, shared + ids(3, 1.5))  # another question on the same prefix
    assert serve(kv, question).hit_tokens == 3 * BS


def test_generated_tokens_fill_blocks_but_the_last_one_is_never_computed() -> None:
    kv, events = cache(20)
    prompt = ids(1, 1.5)  # 6 tokens
    seq = serve(kv, prompt, outputs=3)  # computed: 6 + 2 = 8 tokens, 2 full blocks
    assert seq.cached == 2 and kv.pool.num_cached == 2
    assert events.stored[-1][2] == [*prompt[BS:], 900_000, 900_001]
    turn = [*prompt, 900_000, 900_001, 900_002, 5, 6]
    assert hit(kv, turn) == 2 * BS
    seq = serve(kv, prompt, outputs=2)  # 7 computed: the second block is not full
    assert seq.cached == 1


def test_a_finished_request_is_evicted_tail_first_and_least_recently_freed_first() -> None:
    kv, events = cache(9)  # 8 usable blocks
    a, b = ids(1, 3), ids(2, 3)
    serve(kv, a, outputs=1)  # blocks 1-3
    serve(kv, b, outputs=1)  # blocks 4-6
    assert kv.pool.free_queue() == [7, 8, 3, 2, 1, 6, 5, 4]
    serve(kv, ids(3, 4), outputs=1)  # takes 7, 8, then a's tail: 3 and 2
    ha = token_block_hashes(a, BS)
    assert events.removed == [ha[2], ha[1]]
    assert hit(kv, [*a, 1]) == BS and hit(kv, [*b, 1]) == 3 * BS


def test_a_hit_takes_its_blocks_off_the_free_queue_and_refreshes_them() -> None:
    kv, events = cache(7)  # 6 usable blocks
    a, b = ids(1, 2), ids(2, 2)
    serve(kv, a)  # blocks 1, 2
    serve(kv, b)  # blocks 3, 4
    assert serve(kv, [*a, 7]).hit_tokens == 2 * BS  # a's blocks go back last
    assert kv.pool.free_queue() == [5, 6, 4, 3, 2, 1]  # 5 held the partial block
    serve(kv, ids(3, 4))  # 5, 6, then b's tail and head
    assert events.removed == token_block_hashes(b, BS)[::-1]
    assert hit(kv, [*a, 7]) == 2 * BS


def test_a_freed_partial_block_is_reused_before_any_cached_block() -> None:
    kv, events = cache(6)  # 5 usable blocks
    serve(kv, ids(1, 2.5))  # blocks 1, 2 cached, 3 partial
    assert kv.pool.free_queue() == [3, 4, 5, 2, 1]
    serve(kv, ids(2, 1.5))  # 3 (now full and cached) and 4 (partial)
    assert kv.pool.free_queue() == [4, 5, 2, 1, 3]
    serve(kv, ids(3, 3))  # 4, 5, then the least recently freed cached block: 2
    assert events.removed == token_block_hashes(ids(1, 2), BS)[1:]
    assert hit(kv, [*ids(1, 2), 0]) == BS and hit(kv, [*ids(2, 1), 0]) == BS


def test_a_running_requests_blocks_are_never_evicted() -> None:
    kv, events = cache(6)  # 5 usable blocks
    running = kv.admit(ids(1, 2))  # blocks 1, 2 held
    serve(kv, ids(2, 3))  # takes 3, 4, 5
    serve(kv, ids(3, 3))  # only 3, 4, 5 are free: it evicts the previous prompt's
    assert kv.pool.refs(1) == kv.pool.refs(2) == 1
    assert hit(kv, [*ids(1, 2), 0]) == 2 * BS
    assert len(events.removed) == 3
    kv.free(running)


def test_without_free_blocks_the_rest_overflows_uncached() -> None:
    kv, _ = cache(4)  # 3 usable blocks
    running = kv.admit(ids(1, 2))
    seq = kv.admit(ids(2, 3))  # one block left: two overflow
    assert (len(seq.blocks), seq.overflow, kv.blocks_used) == (1, 2, 5)
    assert seq.cached == 1
    kv.free(seq)
    kv.free(running)
    assert kv.blocks_used == 0 and kv.pool.num_free == 3


def test_held_blocks_leave_the_free_queue_and_return_uncached() -> None:
    kv, events = cache(5)  # 4 usable blocks
    serve(kv, ids(1, 2))
    held = kv.hold(3)  # 3, 4, then the prompt's tail
    assert len(events.removed) == 1 and kv.blocks_used == 3
    kv.free(held)
    assert kv.blocks_used == 0 and kv.pool.num_cached == 1


def test_reset_is_refused_while_a_request_holds_blocks() -> None:
    kv, _ = cache(10)
    running = kv.admit(ids(1, 2))
    assert not kv.pool.reset()
    kv.free(running)
    assert kv.pool.reset() and kv.pool.num_cached == 0


@given(
    st.lists(
        st.tuples(st.integers(0, 5), st.integers(1, 14), st.integers(1, 9)),
        max_size=25,
    )
)
def test_the_pool_stays_consistent(requests: list[tuple[int, int, int]]) -> None:
    kv, events = cache(8)
    for tag, length, outputs in requests:
        serve(kv, ids(tag, length / BS), outputs)
        pool = kv.pool
        assert pool.num_free == pool.capacity and kv.blocks_used == 0
        assert sorted(pool.free_queue()) == list(range(1, 8))
        assert pool.num_cached <= pool.capacity
        # every cached hash is still findable
        for block in range(1, 8):
            h = pool.hash_of(block)
            assert h is None or pool.cached_block(h) is not None
    assert len(events.removed) <= sum(len(s[1]) for s in events.stored)


def test_a_pool_needs_a_block_besides_the_reserved_one() -> None:
    assert BlockPool(2).capacity == 1
    with pytest.raises(ValueError):
        BlockPool(1)
