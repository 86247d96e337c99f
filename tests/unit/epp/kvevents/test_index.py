"""The precise prefix index (epp.kvevents.index): chains built from BlockStored token ids
and parent links, looked up by a request's tokens cut at the endpoint's block size."""

from __future__ import annotations

import itertools
from array import array
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from epp.kvevents.index import Held, PreciseIndex, chain_keys, token_bytes
from epp.kvevents.wire import AllBlocksCleared, BlockRemoved, BlockStored

BS = 4
A, B = "10.0.0.1:8000", "10.0.0.2:8000"


def ev(hashes: list[int], parent: int | None, tokens: list[int], **kw: Any) -> BlockStored:
    return BlockStored(tuple(hashes), parent, array("q", tokens), kw.pop("size", BS), **kw)


def chain_events(tokens: list[int], first_hash: int = 1, pieces: int = 1) -> list[BlockStored]:
    """``tokens`` (whole blocks) announced as ``pieces`` BlockStored events, each linked
    to the block before it (continuation blocks), hashes first_hash, first_hash+1..."""
    n = len(tokens) // BS
    cuts = [round(i * n / pieces) for i in range(pieces + 1)]
    events = []
    for lo, hi in itertools.pairwise(cuts):
        if hi > lo:
            parent = None if lo == 0 else first_hash + lo - 1
            hashes = list(range(first_hash + lo, first_hash + hi))
            events.append(ev(hashes, parent, tokens[lo * BS : hi * BS]))
    return events


def lookup(index: PreciseIndex, tokens: list[int], lora: str = "") -> dict[str, Held]:
    keys = chain_keys(token_bytes(tokens), BS, 10_000, index.root(lora))
    return index.match(keys)


def fresh(*addresses: str) -> PreciseIndex:
    index = PreciseIndex(rebuild_s=30.0)
    for address in addresses:
        index.reset(address, 0.0, complete=True)
    return index


def test_chained_lookup_at_every_block_boundary() -> None:
    tokens = list(range(100, 100 + 6 * BS))
    index = fresh(A)
    index.apply(A, chain_events(tokens, pieces=3), 0.0)
    for length in range(len(tokens) + 2 * BS):
        prompt = tokens[:length] + [7] * max(length - len(tokens), 0)
        held = lookup(index, prompt).get(A)
        expect = min(length // BS, 6)
        if expect == 0:
            assert held is None, length
        else:
            assert held == (expect, expect), length
    # a prompt that differs at token t matches the blocks before t's block
    for t in range(len(tokens)):
        changed = [*tokens[:t], -5, *tokens[t + 1 :]]
        assert lookup(index, changed).get(A, (0, 0))[1] == t // BS


def test_each_endpoint_gets_its_own_longest_chain() -> None:
    shared, a_tail, b_tail = list(range(2 * BS)), [50] * BS * 2, [60] * BS
    index = fresh(A, B)
    index.apply(A, chain_events(shared + a_tail), 0.0)
    index.apply(B, chain_events(shared + b_tail, first_hash=100), 0.0)
    assert lookup(index, shared + a_tail + [1]) == {A: (4, 4), B: (2, 2)}
    assert lookup(index, shared + b_tail) == {A: (2, 2), B: (3, 3)}
    assert lookup(index, [9] * BS * 3) == {}


def test_gpu_blocks_and_offloaded_blocks_are_told_apart() -> None:
    tokens = list(range(6 * BS))
    index = fresh(A)
    index.apply(A, [ev([1, 2, 3, 4], None, tokens[: 4 * BS], medium="GPU")], 0.0)
    index.apply(A, [ev([5, 6], 4, tokens[4 * BS :], medium="CPU")], 0.0)
    assert lookup(index, tokens) == {A: (4, 6)}
    assert index.blocks(A) == (4, 2)
    # the GPU evicts block 2 while the CPU holds a copy of the first three
    index.apply(A, [ev([1, 2, 3], None, tokens[: 3 * BS], medium="CPU")], 0.0)
    index.apply(A, [BlockRemoved((2,), "GPU")], 0.0)
    assert lookup(index, tokens) == {A: (1, 6)}


def test_removed_blocks_cut_the_chain_where_they_were() -> None:
    tokens = list(range(5 * BS))
    index = fresh(A)
    index.apply(A, chain_events(tokens), 0.0)
    index.apply(A, [BlockRemoved((5,), "GPU"), BlockRemoved((4,), "GPU")], 0.0)  # tail first
    assert lookup(index, tokens) == {A: (3, 3)}
    index.apply(A, [BlockRemoved((2,), None)], 0.0)  # a middle block: the rest is unusable
    assert lookup(index, tokens) == {A: (1, 1)}
    index.apply(A, [BlockRemoved((99,), "GPU")], 0.0)
    assert index.stats.removed == 3 and index.stats.removed_unknown == 1


def test_all_blocks_cleared_empties_the_endpoint_and_makes_it_trusted() -> None:
    tokens = list(range(3 * BS))
    index = PreciseIndex(rebuild_s=30.0)
    index.reset(A, 0.0, complete=False)  # events were lost: scored approximately
    index.apply(A, chain_events(tokens), 1.0)
    assert lookup(index, tokens) == {A: (3, 3)}
    assert A not in index.trusted(1.0)
    index.apply(A, [AllBlocksCleared()], 2.0)
    assert lookup(index, tokens) == {} and index.size() == 0
    assert A in index.trusted(2.0) and index.stats.cleared == 1


def test_trust_after_a_reset_a_disconnect_and_a_rebuild() -> None:
    index = PreciseIndex(rebuild_s=30.0)
    assert index.trusted(0.0) == frozenset()  # never heard of
    index.reset(A, 0.0, complete=True)
    index.reset(B, 0.0, complete=False)
    assert index.trusted(0.0) == {A}
    assert index.trusted(29.9) == {A}
    assert index.trusted(30.0) == {A, B}  # rebuilt: 30 s of events since the reset
    index.suspend(A)
    assert index.trusted(31.0) == {B}
    index.resume(A)
    assert index.trusted(31.0) == {A, B}
    index.forget(B)
    assert index.trusted(31.0) == {A} and index.addresses() == [A]


def test_lora_blocks_match_only_requests_for_that_adapter() -> None:
    tokens = list(range(2 * BS))
    index = fresh(A, B)
    index.apply(A, [ev([1, 2], None, tokens, lora_name="sql", lora_id=3)], 0.0)
    index.apply(B, [ev([1, 2], None, tokens)], 0.0)
    assert lookup(index, tokens) == {B: (2, 2)}
    assert lookup(index, tokens, lora="sql") == {A: (2, 2)}
    assert index.lora_names == {"sql"}


def test_blocks_with_extra_keys_beyond_the_adapter_never_match_plain_tokens() -> None:
    tokens = list(range(2 * BS))
    index = fresh(A)
    salted = ev([1, 2], None, tokens, extra_keys=(("salt",), None))
    index.apply(A, [salted, ev([3], 2, [9] * BS)], 0.0)
    assert lookup(index, tokens + [9] * BS) == {}
    assert index.blocks(A) == (3, 0)  # held (removals must find them), just unmatchable
    adapter_only = ev([4], None, tokens[:BS], lora_name="ad", extra_keys=(("ad",),))
    index.apply(A, [adapter_only], 0.0)
    assert lookup(index, tokens, lora="ad") == {A: (1, 1)}


def test_orphans_and_other_groups_are_counted_not_indexed() -> None:
    index = fresh(A)
    index.apply(A, [ev([7], 6, [1] * BS), ev([8], None, [2] * BS, group_idx=1)], 0.0)
    assert index.size() == 0
    assert index.stats.orphans == 1 and index.stats.other_groups == 1


def test_memory_is_bounded_per_endpoint() -> None:
    index = PreciseIndex(max_blocks_per_endpoint=32)
    index.reset(A, 0.0, complete=True)
    for i in range(10):
        index.apply(A, [ev([1000 * i + j for j in range(10)], None, [i] * BS * 10)], 0.0)
        assert index.size() <= 32
    assert index.stats.dropped == 100 - index.size()
    newest = [9] * BS * 10
    assert lookup(index, newest) == {A: (10, 10)}  # the oldest went first


def test_block_sizes_follow_the_endpoints() -> None:
    index = fresh(A, B)
    index.apply(A, [ev([1], None, [0] * BS)], 0.0)
    index.apply(B, [ev([1], None, [0] * 8, size=8)], 0.0)
    assert sorted(index.block_sizes()) == [BS, 8]
    index.forget(B)
    assert index.block_sizes() == [BS]


# -- against a model: any sequence of stores and removals --------------------------------
@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([A, B]),
            st.booleans(),
            st.lists(st.integers(0, 2), min_size=BS, max_size=4 * BS),
        ),
        max_size=25,
    ),
    st.lists(st.integers(0, 2), max_size=5 * BS),
)
def test_lookups_agree_with_a_model_of_what_each_endpoint_holds(
    ops: list[tuple[str, bool, list[int]]], probe: list[int]
) -> None:
    index = fresh(A, B)
    held: dict[str, dict[tuple[int, ...], int]] = {A: {}, B: {}}  # prefix -> engine hash
    next_hash = [1]
    for address, store, tokens in ops:
        blocks = len(tokens) // BS
        prefixes = [tuple(tokens[: (i + 1) * BS]) for i in range(blocks)]
        mine = held[address]
        if store:  # announce the blocks not yet held after the longest held prefix
            have = 0
            while have < blocks and prefixes[have] in mine:
                have += 1
            if have == blocks:
                continue
            hashes = list(range(next_hash[0], next_hash[0] + blocks - have))
            next_hash[0] += len(hashes)
            parent = mine[prefixes[have - 1]] if have else None
            index.apply(address, [ev(hashes, parent, tokens[have * BS : blocks * BS])], 0.0)
            mine.update(zip(prefixes[have:], hashes, strict=True))
        elif blocks and prefixes[-1] in mine:  # evict the chain's last block
            index.apply(address, [BlockRemoved((mine.pop(prefixes[-1]),), "GPU")], 0.0)
    found = lookup(index, probe)
    for address, mine in held.items():
        n = 0
        while (n + 1) * BS <= len(probe) and tuple(probe[: (n + 1) * BS]) in mine:
            n += 1
        assert found.get(address, (0, 0))[1] == n
