"""The messages between the parent and its workers, and their codec (pure).

Each message is a msgspec Struct tagged by its class name, sent as one msgpack frame
behind a 4-byte big-endian length. Endpoints and their load travel as plain fields, so
the codec does not depend on how :mod:`epp.types` builds its dataclasses."""

from __future__ import annotations

import struct
from collections.abc import Iterable

import msgspec

from epp.datastore import Member, Status
from epp.types import Endpoint, EndpointMetrics, Role

HEADER = struct.Struct(">I")
MAX_FRAME_BYTES = 64 * 1024 * 1024


class WireEndpoint(msgspec.Struct, frozen=True):
    host: str
    port: int
    role: str
    labels: dict[str, str]
    engine: str
    name: str


class WireMember(msgspec.Struct, frozen=True):
    endpoint: WireEndpoint
    status: str


class WireMetrics(msgspec.Struct, frozen=True):
    updated_at: float
    waiting: float | None
    running: float | None
    kv_usage: float | None
    lora_running: list[str]
    lora_waiting: list[str]
    max_lora: int | None
    block_size: int | None
    num_blocks: int | None
    prefix_cache_queries: float | None
    prefix_cache_hits: float | None
    started_at: float | None
    orca: dict[str, float]


# parent -> worker
class Members(msgspec.Struct, frozen=True, tag=True):
    """The whole membership, after every change; acknowledged with :class:`Ack`."""

    version: int
    members: list[WireMember]


class EndpointData(msgspec.Struct, frozen=True):
    """One member's newest reported load (a scrape or ORCA report in the parent)."""

    address: str
    metrics: WireMetrics


class Loads(msgspec.Struct, frozen=True, tag=True):
    """The members whose load changed since the last such message, each with its
    newest report (the parent sends them together: one frame and one wake-up per
    worker for many reports)."""

    reports: list[EndpointData]


class Objectives(msgspec.Struct, frozen=True, tag=True):
    """The watched InferenceObjectives' priorities (objective name -> priority), whole,
    on connecting and after every change (the workers run no discovery of their own)."""

    priorities: dict[str, int]


class Synced(msgspec.Struct, frozen=True, tag=True):
    """Either way: an Envoy acknowledged the EDS endpoints (of some worker)."""


# worker -> parent
class Hello(msgspec.Struct, frozen=True, tag=True):
    index: int
    pid: int


class Ready(msgspec.Struct, frozen=True, tag=True):
    grpc_port: int
    http_port: int
    health_port: int | None


class Ack(msgspec.Struct, frozen=True, tag=True):
    version: int


class Outcome(msgspec.Struct, frozen=True, tag=True):
    """How a routed request went on its endpoint (the parent's ejector judges)."""

    address: str
    ok: bool
    reason: str = ""
    slow: bool = False
    serving: bool = True


Message = Members | Loads | Objectives | Synced | Hello | Ready | Ack | Outcome

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Message)


def encode(message: Message) -> bytes:
    """One frame: length, then the msgpack body."""
    body = _encoder.encode(message)
    return HEADER.pack(len(body)) + body


def decode(body: bytes) -> Message:
    """A frame's body (without its length); msgspec.DecodeError if it is not one."""
    message: Message = _decoder.decode(body)
    return message


def wire_endpoint(endpoint: Endpoint) -> WireEndpoint:
    return WireEndpoint(
        endpoint.host,
        endpoint.port,
        endpoint.role.value,
        dict(endpoint.labels),
        endpoint.engine,
        endpoint.name,
    )


def endpoint(wire: WireEndpoint) -> Endpoint:
    return Endpoint(
        wire.host, wire.port, Role(wire.role), dict(wire.labels), wire.engine, wire.name
    )


def members(version: int, listed: Iterable[Member]) -> Members:
    return Members(version, [WireMember(wire_endpoint(m.endpoint), m.status.value) for m in listed])


def status(wire: WireMember) -> Status:
    return Status(wire.status)


def wire_metrics(m: EndpointMetrics) -> WireMetrics:
    return WireMetrics(
        updated_at=m.updated_at,
        waiting=m.waiting,
        running=m.running,
        kv_usage=m.kv_usage,
        lora_running=sorted(m.lora_running),
        lora_waiting=sorted(m.lora_waiting),
        max_lora=m.max_lora,
        block_size=m.block_size,
        num_blocks=m.num_blocks,
        prefix_cache_queries=m.prefix_cache_queries,
        prefix_cache_hits=m.prefix_cache_hits,
        started_at=m.started_at,
        orca=dict(m.orca),
    )


def metrics(wire: WireMetrics) -> EndpointMetrics:
    return EndpointMetrics(
        updated_at=wire.updated_at,
        waiting=wire.waiting,
        running=wire.running,
        kv_usage=wire.kv_usage,
        lora_running=frozenset(wire.lora_running),
        lora_waiting=frozenset(wire.lora_waiting),
        max_lora=wire.max_lora,
        block_size=wire.block_size,
        num_blocks=wire.num_blocks,
        prefix_cache_queries=wire.prefix_cache_queries,
        prefix_cache_hits=wire.prefix_cache_hits,
        started_at=wire.started_at,
        orca=dict(wire.orca),
    )
