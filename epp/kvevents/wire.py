"""vLLM's KV-cache events as they arrive on the socket (pure: bytes in, typed events out).

A message is three ZMQ frames: the topic, the sequence number (8 bytes, big-endian,
counting from 0 per publisher process) and a msgpack payload. The payload is an
``EventBatch``: an array ``[timestamp, [event, ...], data_parallel_rank]`` (a map
``{"ts", "events", "data_parallel_rank"}`` is accepted too: which one a vLLM version
sends depends on how it declares the struct). Each event is a map tagged by its
``"type"`` (``BlockStored``, ``BlockRemoved``, ``AllBlocksCleared``); fields whose value
is the default are left out. Older vLLM versions send each event as an array, tag
first, fields in declaration order; both forms decode to the same objects.

Forward compatible: an event type we do not know is skipped and counted, a field we do
not know is ignored and counted. A payload that is not an event batch at all (not
msgpack, wrong shapes, a required field missing or of the wrong type) raises
:class:`KvEventDecodeError`, which the subscriber counts: it never crashes the EPP.
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeGuard

import msgspec

from epp.errors import InternalError

# vLLM publishes a block hash as an int (the low 64 bits of its digest); some versions
# declare bytes. Either is only ever compared for equality here.
BlockHash = int | bytes

# the replay socket's end marker: the sequence number -1 (signed)
END_OF_REPLAY = -1


class KvEventDecodeError(InternalError, ValueError):
    """A message that is not a KV-event batch (the text says what is wrong)."""


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Full blocks newly cached, in chain order. ``token_ids`` holds the tokens of these
    blocks only (``block_size`` per block), as 64-bit ints; ``parent_block_hash`` is the
    engine's hash of the block before the first one (None: a chain starts here)."""

    block_hashes: tuple[BlockHash, ...]
    parent_block_hash: BlockHash | None
    token_ids: array[int]
    block_size: int
    lora_id: int | None = None
    lora_name: str | None = None
    medium: str | None = None
    # per block: what else the engine hashed into it (LoRA name, cache salt, images)
    extra_keys: tuple[tuple[Any, ...] | None, ...] | None = None
    group_idx: int | None = None


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """Blocks evicted (vLLM sends one event per block, the chain's tail first)."""

    block_hashes: tuple[BlockHash, ...]
    medium: str | None = None
    group_idx: int | None = None


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """The whole prefix cache was dropped (e.g. ``POST /reset_prefix_cache``)."""


KvEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class EventBatch:
    ts: float
    events: tuple[KvEvent, ...]
    data_parallel_rank: int | None = None
    unknown_events: int = 0  # events of a type we do not know, skipped
    unknown_fields: int = 0  # fields we do not know, ignored


@dataclass(frozen=True, slots=True)
class KvMessage:
    topic: bytes
    seq: int
    batch: EventBatch = field(repr=False)


# field order of each event type (the array form sends them by position)
_FIELDS: Mapping[str, tuple[str, ...]] = {
    "BlockStored": (
        "block_hashes",
        "parent_block_hash",
        "token_ids",
        "block_size",
        "lora_id",
        "medium",
        "lora_name",
        "extra_keys",
        "group_idx",
        "kv_cache_spec_kind",
        "kv_cache_spec_sliding_window",
    ),
    "BlockRemoved": ("block_hashes", "medium", "group_idx"),
    "AllBlocksCleared": (),
}
_KNOWN = {tag: frozenset((*names, "type")) for tag, names in _FIELDS.items()}
_CLEARED = AllBlocksCleared()
_decode = msgspec.msgpack.Decoder()


def sequence_number(frame: bytes) -> int:
    """The 8-byte big-endian sequence number of a frame (signed: -1 ends a replay)."""
    if len(frame) != 8:
        raise KvEventDecodeError(f"sequence number frame has {len(frame)} bytes, expected 8")
    return int.from_bytes(frame, "big", signed=True)


def decode_message(frames: Sequence[bytes]) -> KvMessage:
    """``(topic, seq, payload)`` frames -> the message; raises KvEventDecodeError."""
    if len(frames) != 3:
        raise KvEventDecodeError(f"expected 3 frames (topic, seq, payload), got {len(frames)}")
    topic, seq, payload = frames
    number = sequence_number(seq)
    if number < 0:
        raise KvEventDecodeError(f"negative sequence number {number} on the event stream")
    return KvMessage(bytes(topic), number, decode_batch(payload))


def decode_batch(payload: bytes) -> EventBatch:
    """A msgpack EventBatch -> typed events; raises KvEventDecodeError."""
    try:
        doc = _decode.decode(payload)
    except msgspec.DecodeError as exc:
        raise KvEventDecodeError(f"payload is not msgpack: {exc}") from None
    if isinstance(doc, list):
        if len(doc) < 2:
            raise KvEventDecodeError(f"event batch array has {len(doc)} items, expected 2-3")
        ts, raw_events = doc[0], doc[1]
        rank = doc[2] if len(doc) > 2 else None
        unknown_fields = max(len(doc) - 3, 0)
    elif isinstance(doc, dict):
        ts, raw_events = doc.get("ts"), doc.get("events")
        rank = doc.get("data_parallel_rank")
        unknown_fields = len(set(doc) - {"ts", "events", "data_parallel_rank"})
    else:
        raise KvEventDecodeError(f"event batch is a {type(doc).__name__}, not an array or map")
    if isinstance(ts, bool) or not isinstance(ts, int | float):
        raise KvEventDecodeError(f"event batch timestamp is {ts!r}, not a number")
    if not isinstance(raw_events, list):
        raise KvEventDecodeError("event batch has no list of events")
    if rank is not None and not _is_int(rank):
        raise KvEventDecodeError(f"data_parallel_rank is {rank!r}, not an integer")
    events: list[KvEvent] = []
    unknown_events = 0
    for i, raw in enumerate(raw_events):
        tag, values, extra = _fields(raw, i)
        unknown_fields += extra
        if tag == "BlockStored":
            events.append(_stored(values, i))
        elif tag == "BlockRemoved":
            events.append(
                BlockRemoved(
                    _hashes(values, i), _text(values, "medium", i), _opt_int(values, "group_idx", i)
                )
            )
        elif tag == "AllBlocksCleared":
            events.append(_CLEARED)
        else:
            unknown_events += 1
    return EventBatch(float(ts), tuple(events), rank, unknown_events, unknown_fields)


def _fields(raw: Any, i: int) -> tuple[str, dict[str, Any], int]:
    """(tag, field values by name, fields we do not know) of one event in either form."""
    if isinstance(raw, dict):
        tag = raw.get("type")
        if not isinstance(tag, str):
            raise KvEventDecodeError(f"events[{i}] has no string 'type' tag")
        known = _KNOWN.get(tag)
        return tag, raw, 0 if known is None else len(raw.keys() - known)
    if isinstance(raw, list) and raw and isinstance(raw[0], str):
        tag = raw[0]
        names = _FIELDS.get(tag)
        if names is None:
            return tag, {}, 0
        return tag, dict(zip(names, raw[1:], strict=False)), max(len(raw) - 1 - len(names), 0)
    raise KvEventDecodeError(f"events[{i}] is neither a tagged map nor a tagged array")


def _stored(v: Mapping[str, Any], i: int) -> BlockStored:
    hashes = _hashes(v, i)
    size = v.get("block_size")
    if not _is_int(size) or size < 1:
        raise KvEventDecodeError(f"events[{i}].block_size is {size!r}, not a positive integer")
    raw_tokens = v.get("token_ids")
    if not isinstance(raw_tokens, list):
        raise KvEventDecodeError(f"events[{i}].token_ids is not a list")
    try:
        tokens = array("q", raw_tokens)
    except (TypeError, OverflowError):
        raise KvEventDecodeError(f"events[{i}].token_ids holds a non-integer") from None
    if len(tokens) != len(hashes) * size:
        raise KvEventDecodeError(
            f"events[{i}] has {len(tokens)} token ids for {len(hashes)} blocks of {size}"
        )
    parent = v.get("parent_block_hash")
    if parent is not None and not _is_hash(parent):
        raise KvEventDecodeError(f"events[{i}].parent_block_hash is {parent!r}")
    extra = v.get("extra_keys")
    if extra is not None:
        if not isinstance(extra, list) or len(extra) != len(hashes):
            raise KvEventDecodeError(f"events[{i}].extra_keys is not one entry per block")
        extra = tuple(
            None if e is None else tuple(e) if isinstance(e, list) else (e,) for e in extra
        )
    lora_id = _opt_int(v, "lora_id", i)
    return BlockStored(
        hashes,
        parent,
        tokens,
        size,
        lora_id,
        _text(v, "lora_name", i),
        _text(v, "medium", i),
        extra,
        _opt_int(v, "group_idx", i),
    )


def _hashes(v: Mapping[str, Any], i: int) -> tuple[BlockHash, ...]:
    raw = v.get("block_hashes")
    if not isinstance(raw, list) or not all(map(_is_hash, raw)):
        raise KvEventDecodeError(f"events[{i}].block_hashes is not a list of hashes")
    return tuple(raw)


def _text(v: Mapping[str, Any], name: str, i: int) -> str | None:
    value = v.get(name)
    if value is not None and not isinstance(value, str):
        raise KvEventDecodeError(f"events[{i}].{name} is {value!r}, not a string")
    return value


def _opt_int(v: Mapping[str, Any], name: str, i: int) -> int | None:
    value = v.get(name)
    if value is not None and not _is_int(value):
        raise KvEventDecodeError(f"events[{i}].{name} is {value!r}, not an integer")
    return value


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_hash(value: object) -> TypeGuard[BlockHash]:
    return isinstance(value, bytes) or _is_int(value)
