"""Decoding vLLM's KV-event messages from bytes (epp.kvevents.wire).

The frames here are built with msgspec as a real vLLM 0.32 (CPU build, observed)
sends them (an array batch, events as maps tagged by "type", default fields left
out), plus the older all-array form; and messages captured from a real vLLM by the
real-engine tier (`tests/fixtures/vllm-kv-events.json`, docs/test-vllm.md).
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from epp.kvevents.index import PreciseIndex
from epp.kvevents.wire import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KvEventDecodeError,
    decode_batch,
    decode_message,
    sequence_number,
)


class Batch(msgspec.Struct, array_like=True, omit_defaults=True):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class MapBatch(msgspec.Struct, omit_defaults=True):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class Event(msgspec.Struct, tag=True, omit_defaults=True):
    pass


class Stored(Event, tag="BlockStored"):
    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[Any] | None = None
    group_idx: int | None = None


class Removed(Event, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None
    group_idx: int | None = None


class Cleared(Event, tag="AllBlocksCleared"):
    pass


class OldStored(msgspec.Struct, array_like=True, tag="BlockStored"):
    """vLLM before the map form: positional fields after the tag."""

    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None


def frames(seq: int, *events: Any, topic: bytes = b"kv") -> list[bytes]:
    payload = msgspec.msgpack.encode(Batch(1700000000.5, list(events), 0))
    return [topic, seq.to_bytes(8, "big"), payload]


def stored(hashes: list[Any], parent: Any, block: int = 4, **kw: Any) -> Stored:
    tokens = [n * 100 + i for n in range(11, 11 + len(hashes)) for i in range(block)]
    defaults: dict[str, Any] = {"lora_id": None, "medium": "GPU", "lora_name": None}
    return Stored(hashes, parent, tokens, block, **{**defaults, **kw})


def test_a_message_of_each_event_type_decodes_to_typed_events() -> None:
    msg = decode_message(
        frames(7, stored([11, 12], None), Removed([12], "GPU"), Cleared(), topic=b"kv-x")
    )
    assert (msg.topic, msg.seq) == (b"kv-x", 7)
    assert msg.batch.ts == 1700000000.5 and msg.batch.data_parallel_rank == 0
    first, second, third = msg.batch.events
    assert isinstance(first, BlockStored)
    assert first.block_hashes == (11, 12) and first.parent_block_hash is None
    assert list(first.token_ids) == [1100, 1101, 1102, 1103, 1200, 1201, 1202, 1203]
    assert (first.block_size, first.medium, first.lora_id) == (4, "GPU", None)
    assert second == BlockRemoved((12,), "GPU")
    assert third == AllBlocksCleared()


def test_fields_left_out_take_their_defaults() -> None:
    raw = {"type": "BlockStored", "block_hashes": [1], "token_ids": [5, 6], "block_size": 2}
    (event,) = decode_batch(msgspec.msgpack.encode([0.0, [raw]])).events
    assert isinstance(event, BlockStored)
    assert event.parent_block_hash is None and event.medium is None and event.extra_keys is None
    (removed,) = decode_batch(
        msgspec.msgpack.encode([0.0, [{"type": "BlockRemoved", "block_hashes": [1]}]])
    ).events
    assert removed == BlockRemoved((1,), None, None)


def test_lora_medium_extra_keys_and_group_are_read() -> None:
    event = stored(
        [3], 2, lora_id=4, lora_name="ad", medium="CPU", extra_keys=[["ad"]], group_idx=1
    )
    (decoded,) = decode_message(frames(0, event)).batch.events
    assert isinstance(decoded, BlockStored)
    assert (decoded.lora_id, decoded.lora_name, decoded.medium) == (4, "ad", "CPU")
    assert decoded.extra_keys == (("ad",),) and decoded.group_idx == 1
    assert decoded.parent_block_hash == 2


def test_bytes_block_hashes_are_accepted() -> None:
    (event,) = decode_message(frames(0, stored([b"\x01" * 32], b"\x02" * 32))).batch.events
    assert isinstance(event, BlockStored) and event.block_hashes == (b"\x01" * 32,)


def test_the_older_array_forms_decode_the_same() -> None:
    old = OldStored([11, 12], None, [0, 1, 2, 3, 4, 5], 3, None)
    payload = msgspec.msgpack.encode(Batch(2.0, [old, ["BlockRemoved", [12], None]]))
    first, second = decode_batch(payload).events
    assert isinstance(first, BlockStored) and first.block_hashes == (11, 12)
    assert first.block_size == 3 and list(first.token_ids) == list(range(6))
    assert second == BlockRemoved((12,), None)


def test_a_map_batch_decodes_too() -> None:
    payload = msgspec.msgpack.encode(MapBatch(3.0, [Cleared()], 2))
    batch = decode_batch(payload)
    assert batch.ts == 3.0 and batch.events == (AllBlocksCleared(),)
    assert batch.data_parallel_rank == 2


def test_unknown_event_types_are_skipped_and_unknown_fields_ignored_and_counted() -> None:
    events = [
        {"type": "BlockPinned", "block_hashes": [1]},
        {"type": "BlockRemoved", "block_hashes": [1], "medium": "GPU", "new_thing": 1},
        ["SomethingElse", 1, 2],
        ["BlockRemoved", [2], "GPU", None, "extra"],
    ]
    batch = decode_batch(msgspec.msgpack.encode([0.0, events, 0, "more"]))
    assert batch.events == (BlockRemoved((1,), "GPU"), BlockRemoved((2,), "GPU"))
    assert batch.unknown_events == 2
    assert batch.unknown_fields == 3  # new_thing, "extra", the batch's fourth item


@pytest.mark.parametrize(
    ("payload", "problem"),
    [
        (b"\xc1", "not msgpack"),
        (msgspec.msgpack.encode("text"), "not an array or map"),
        (msgspec.msgpack.encode([1.0]), "expected 2-3"),
        (msgspec.msgpack.encode(["x", []]), "timestamp"),
        (msgspec.msgpack.encode([1.0, {}]), "list of events"),
        (msgspec.msgpack.encode([1.0, [], "rank"]), "data_parallel_rank"),
        (msgspec.msgpack.encode([1.0, [5]]), "neither a tagged map"),
        (msgspec.msgpack.encode([1.0, [{"block_hashes": []}]]), "'type'"),
        (msgspec.msgpack.encode(Batch(1, [Removed(["x"], None)])), "block_hashes"),  # type: ignore[list-item]
        (msgspec.msgpack.encode(Batch(1, [stored([1], None, block=0)])), "block_size"),
        (
            msgspec.msgpack.encode(Batch(1, [Stored([1], None, [1.5, 2], 2, None, None, None)])),  # type: ignore[list-item]
            "non-integer",
        ),
        (
            msgspec.msgpack.encode(Batch(1, [Stored([1, 2], None, [1, 2], 2, None, None, None)])),
            "2 token ids for 2 blocks",
        ),
        (msgspec.msgpack.encode(Batch(1, [stored([1], None, medium=3)])), "medium"),
        (msgspec.msgpack.encode(Batch(1, [stored([1], None, extra_keys=[])])), "extra_keys"),
        (msgspec.msgpack.encode(Batch(1, [stored([1], "p")])), "parent_block_hash"),
    ],
)
def test_bad_payloads_raise_a_decode_error_saying_what(payload: bytes, problem: str) -> None:
    with pytest.raises(KvEventDecodeError, match=problem):
        decode_batch(payload)


def test_frames_and_sequence_numbers() -> None:
    assert sequence_number((2**63 + 5).to_bytes(8, "big")) < 0  # read signed: -1 ends a replay
    assert sequence_number((-1).to_bytes(8, "big", signed=True)) == -1
    with pytest.raises(KvEventDecodeError, match="3 frames"):
        decode_message(frames(0)[:2])
    with pytest.raises(KvEventDecodeError, match="expected 8"):
        decode_message([b"kv", b"\x00" * 4, msgspec.msgpack.encode([0.0, []])])
    with pytest.raises(KvEventDecodeError, match="negative"):
        decode_message([b"kv", b"\xff" * 8, msgspec.msgpack.encode([0.0, []])])


CAPTURED = Path(__file__).resolve().parents[3] / "fixtures" / "vllm-kv-events.json"


def test_messages_captured_from_a_real_vllm_decode_and_rebuild_its_cache() -> None:
    """Every message one vLLM 0.32 server (CPU build, 64 blocks of 128 tokens)
    published in `make test-vllm`'s precise-index test, from its AllBlocksCleared on
    (docs/test-vllm.md): chains, continuations of cached parents, evictions."""
    frames = [[base64.b64decode(f) for f in m] for m in json.loads(CAPTURED.read_text())]
    messages = [decode_message(m) for m in frames]
    first = messages[0].seq
    assert [m.seq for m in messages] == list(range(first, first + len(messages)))
    assert {m.topic for m in messages} == {b"kv"}
    events = [e for m in messages for e in m.batch.events]
    assert all(m.batch.unknown_events == m.batch.unknown_fields == 0 for m in messages)
    assert isinstance(events[0], AllBlocksCleared)
    stored = [e for e in events if isinstance(e, BlockStored)]
    assert {e.block_size for e in stored} == {128} and {e.medium for e in stored} == {"GPU"}
    assert all(len(e.token_ids) == 128 * len(e.block_hashes) for e in stored)
    assert any(e.parent_block_hash is None for e in stored)
    assert any(e.parent_block_hash is not None for e in stored)
    # what the server holds, from the engine's hashes alone, equals what the index holds
    held: set[object] = set()
    index = PreciseIndex()
    for m in messages:
        for e in m.batch.events:
            if isinstance(e, AllBlocksCleared):
                held.clear()
            elif isinstance(e, BlockStored):
                held.update(e.block_hashes)
            elif isinstance(e, BlockRemoved):
                held.difference_update(e.block_hashes)
        index.apply("vllm", m.batch.events, now=0.0)
    assert any(isinstance(e, BlockRemoved) for e in events)
    assert 0 < len(held) <= 64
    assert index.blocks("vllm") == (len(held), 0)
