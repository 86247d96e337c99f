"""The simulator's KV-event publisher, in vLLM's wire format (docs/kv-events.md).

A PUB socket bound on ``--kv-events-port`` sends one message per event-loop turn in
which the prefix cache changed: frames ``(topic, sequence number as 8 bytes
big-endian, msgpack [timestamp, [events], data_parallel_rank])``, each event a map
tagged by ``"type"`` with fields left out when they hold their default, as vLLM 0.32
sends them. ``BlockStored`` announces newly cached full blocks (token ids included),
``BlockRemoved`` each evicted block (a prompt's tail goes first), ``AllBlocksCleared``
a reset. An optional ROUTER socket (``--kv-events-replay-port``) re-sends buffered
messages from a requested sequence number and ends with number -1, as vLLM's
``replay_endpoint`` does.

The structs below are this simulator's own statement of that format (the EPP decodes
it with its own code, epp.kvevents.wire). A block hash is the low 64 bits of the
simulator's block digest, as vLLM publishes the low 64 bits of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

import msgspec
import zmq
import zmq.asyncio

log = logging.getLogger(__name__)

GPU = "GPU"
END_SEQ = (-1).to_bytes(8, "big", signed=True)


class _EventBatch(msgspec.Struct, array_like=True, omit_defaults=True):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class _Event(msgspec.Struct, tag=True, omit_defaults=True):
    pass


class BlockStored(_Event):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[Any] | None = None
    group_idx: int | None = None


class BlockRemoved(_Event):
    block_hashes: list[int]
    medium: str | None
    group_idx: int | None = None


class AllBlocksCleared(_Event):
    pass


def wire_hash(digest: bytes) -> int:
    """The published form of a block digest: its low 64 bits."""
    return int.from_bytes(digest[-8:], "big")


class KvEventPublisher:
    """Collects the engine's cache changes and publishes them once per loop turn."""

    def __init__(self, topic: str = "", buffer_steps: int = 10_000) -> None:
        self.topic = topic.encode()
        self._encoder = msgspec.msgpack.Encoder()
        self._pending: list[_Event] = []
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._seq = 0
        self._drop = 0
        self._flush_scheduled = False
        self._context: zmq.asyncio.Context | None = None
        self._pub: zmq.asyncio.Socket | None = None
        self._router: zmq.asyncio.Socket | None = None
        self._replayer: asyncio.Task[None] | None = None
        self.published = 0  # messages sent (dropped ones not counted)

    async def start(self, host: str, port: int, replay_port: int | None) -> tuple[int, int | None]:
        """Bind (port 0: a free one); returns the ports bound."""
        self._context = zmq.asyncio.Context()
        self._pub = self._context.socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        bound = _bind(self._pub, host, port)
        bound_replay = None
        if replay_port is not None:
            self._router = self._context.socket(zmq.ROUTER)
            self._router.setsockopt(zmq.LINGER, 0)
            bound_replay = _bind(self._router, host, replay_port)
            self._replayer = asyncio.get_running_loop().create_task(self._serve_replays())
        return bound, bound_replay

    async def stop(self) -> None:
        if self._replayer is not None:
            self._replayer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._replayer
        if self._context is not None:
            self._context.destroy(linger=0)
            self._context = None

    # -- what the engine reports (KvEventSink) -----------------------------------------
    def stored(
        self, parent: bytes | None, hashes: Sequence[bytes], token_ids: Sequence[int], size: int
    ) -> None:
        self._add(
            BlockStored(
                block_hashes=[wire_hash(h) for h in hashes],
                parent_block_hash=None if parent is None else wire_hash(parent),
                token_ids=list(token_ids),
                block_size=size,
                lora_id=None,
                medium=GPU,
                lora_name=None,
            )
        )

    def removed(self, block: bytes) -> None:
        self._add(BlockRemoved(block_hashes=[wire_hash(block)], medium=GPU))

    def cleared(self) -> None:
        self._add(AllBlocksCleared())

    def drop_next(self, batches: int) -> None:
        """Test hook: number and buffer the next ``batches`` messages but do not send
        them (a subscriber sees a sequence gap; a replay still has them)."""
        self._drop += batches

    # -- internals ---------------------------------------------------------------------
    def _add(self, event: _Event) -> None:
        self._pending.append(event)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            try:
                asyncio.get_running_loop().call_soon(self._flush)
            except RuntimeError:  # no loop (a unit test driving the engine directly)
                self._flush()

    def _flush(self) -> None:
        self._flush_scheduled = False
        events, self._pending = self._pending, []
        if not events:
            return
        seq, self._seq = self._seq, self._seq + 1
        payload = self._encoder.encode(_EventBatch(time.time(), list(events), 0))
        self._buffer.append((seq, payload))
        if self._drop:
            self._drop -= 1
            return
        if self._pub is not None:
            # a PUB socket never blocks: past its high-water mark it drops, as vLLM's
            self._pub.send_multipart((self.topic, seq.to_bytes(8, "big"), payload), zmq.NOBLOCK)
            self.published += 1

    async def _serve_replays(self) -> None:
        assert self._router is not None
        router = self._router
        while True:
            frames = await router.recv_multipart()
            if len(frames) != 3:
                log.warning("ignoring a replay request of %d frames", len(frames))
                continue
            identity, _, start = frames
            first = int.from_bytes(start, "big")
            for seq, payload in list(self._buffer):
                if seq >= first:
                    reply = (identity, b"", self.topic, seq.to_bytes(8, "big"), payload)
                    await router.send_multipart(reply)
            await router.send_multipart((identity, b"", b"", END_SEQ, b""))  # as vLLM ends


def _bind(sock: zmq.asyncio.Socket, host: str, port: int) -> int:
    where = f"[{host}]" if ":" in host else host
    if ":" in host:
        sock.setsockopt(zmq.IPV6, 1)
    if port == 0:
        bound: int = sock.bind_to_random_port(f"tcp://{where}")
        return bound
    sock.bind(f"tcp://{where}:{port}")
    return port
