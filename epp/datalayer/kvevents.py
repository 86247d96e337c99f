"""Follow every endpoint's KV events: one ZMQ SUB socket per endpoint (asyncio).

The server binds its PUB socket; we connect (epp.kvevents.settings says where), so any
number of EPP replicas can listen to the same server. ZMQ reconnects by itself with a
backoff (100 ms doubling to 5 s) and drops a peer that stops answering heartbeats; a
socket monitor tells us when the connection breaks, and the endpoint is then not
trusted until a message proves nothing was lost.

Sequence numbers (per publisher, from 0) decide what the index may believe:

* the next number: apply it;
* the first message seen, or a number past the next (a gap: messages were lost):
  replay what is missing from the server's replay socket when one is configured;
  without it (or when its buffer no longer reaches back) the endpoint's blocks are
  reset and it is scored approximately until rebuilt (``rebuildSeconds``), unless the
  message is number 0 (the publisher's whole history follows);
* a smaller number: the server restarted (0: nothing of the new process was missed).

Every message that cannot be decoded is counted and treated as lost; nothing here
raises out of the task. Counters and the index's size are exported on /metrics.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from enum import Enum
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from epp.common.lazymodule import lazy_module
from epp.datalayer.tasks import EndpointTasks
from epp.datastore import Datastore
from epp.kvevents.index import PreciseIndex
from epp.kvevents.settings import KvEventsSettings
from epp.kvevents.wire import (
    END_OF_REPLAY,
    KvEventDecodeError,
    KvMessage,
    decode_batch,
    decode_message,
    sequence_number,
)
from epp.types import Endpoint

if TYPE_CHECKING:
    import zmq
    import zmq.asyncio
    import zmq.utils.monitor
else:  # only a config with a precise prefix scorer subscribes
    zmq = lazy_module("zmq", "zmq.asyncio", "zmq.utils.monitor")

log = logging.getLogger(__name__)

RECONNECT_S = (0.1, 5.0)  # ZMQ's reconnect backoff, and ours after a failure
HEARTBEAT_S = (2.0, 6.0)  # ping every ..., drop the connection after ... of silence
RECEIVE_HWM = 100_000  # messages ZMQ queues for us before it drops (a gap)
REPLAY_TIMEOUT_S = 1.0  # per reply frame of the replay socket


class Step(Enum):
    NEXT = "next"
    FIRST = "first"  # nothing seen on this stream yet
    GAP = "gap"  # past the next number: messages were lost
    DUPLICATE = "duplicate"  # already applied (from a replay)
    RESTART = "restart"  # a new publisher process


def step(expected: int | None, seq: int, replayed_upto: int) -> Step:
    """How message ``seq`` relates to the stream so far (pure)."""
    if expected is None:
        return Step.FIRST
    if seq == expected:
        return Step.NEXT
    if seq > expected:
        return Step.GAP
    if seq <= replayed_upto:  # a replay applied it; the live stream repeats it
        return Step.DUPLICATE
    return Step.RESTART


@dataclass(slots=True)
class KvEventCounters:
    """Counters since start, over all endpoints (exported as epp_kv_event_*)."""

    messages: int = 0  # batches applied
    events: int = 0  # events in them
    gaps: int = 0  # sequence gaps seen
    decode_errors: int = 0  # messages that were not KV-event batches
    unknown_events: int = 0  # events of a type we do not know (skipped)
    unknown_fields: int = 0  # fields we do not know (ignored)
    restarts: int = 0  # publishers that started over
    disconnects: int = 0
    replays: int = 0  # replays that filled a gap completely
    replays_partial: int = 0  # replays whose buffer no longer reached back far enough
    replays_failed: int = 0  # replay socket did not answer
    failures: int = 0  # subscriber loops that failed and were restarted


@runtime_checkable
class KvEventSource(Protocol):
    """A plugin that wants KV events: its index, and where endpoints publish."""

    index: PreciseIndex
    events: KvEventsSettings


@dataclass(slots=True)
class _Stream:
    """One endpoint's position in its publisher's sequence."""

    address: str
    replay: str | None
    expected: int | None = None
    replayed_upto: int = -1


class KvEventSubscribers:
    """Keeps a SUB socket on every endpoint that publishes KV events, feeding ``index``."""

    def __init__(
        self,
        datastore: Datastore,
        index: PreciseIndex,
        settings: KvEventsSettings,
        *,
        clock: Callable[[], float] = time.monotonic,
        replay_timeout_s: float = REPLAY_TIMEOUT_S,
    ) -> None:
        self.index = index
        self.settings = settings
        self.counters = KvEventCounters()
        self._clock = clock
        self._replay_timeout_s = replay_timeout_s
        self._context: zmq.asyncio.Context | None = None
        self._tasks = EndpointTasks("kv-events", datastore, self._follow)

    def start(self) -> None:
        """Start following the datastore's endpoints (call from the event loop)."""
        if self._context is None:
            self._context = zmq.asyncio.Context()
            # a SUB socket and its monitor per endpoint, and a replay socket at times
            self._context.set(zmq.MAX_SOCKETS, 65_536)
        self._tasks.start()

    async def stop(self) -> None:
        await self._tasks.stop()
        if self._context is not None:
            self._context.destroy(linger=0)
            self._context = None

    def following(self) -> list[str]:
        """Endpoints with a subscriber task (tests, /status)."""
        return self._tasks.addresses()

    async def _follow(self, endpoint: Endpoint) -> None:
        try:
            url, replay = self.settings.addresses(endpoint)
        except ValueError as exc:
            log.warning("KV events of %s: %s; scoring it approximately", endpoint.address, exc)
            return
        if url is None:
            return
        backoff = RECONNECT_S[0]
        try:
            while True:
                stream = _Stream(endpoint.address, replay)
                try:
                    await self._stream(url, stream)
                except asyncio.CancelledError:
                    raise
                except Exception:  # never let one endpoint's stream take anything down
                    self.counters.failures += 1
                    log.warning(
                        "KV events of %s (%s) failed; retrying in %.1fs",
                        endpoint.address,
                        url,
                        backoff,
                        exc_info=True,
                    )
                self.index.suspend(endpoint.address)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, RECONNECT_S[1])
        finally:
            self.index.forget(endpoint.address)

    async def _stream(self, url: str, stream: _Stream) -> None:
        assert self._context is not None
        sub = self._context.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.IPV6, 1)
        sub.setsockopt(zmq.RCVHWM, RECEIVE_HWM)
        sub.setsockopt(zmq.RECONNECT_IVL, int(RECONNECT_S[0] * 1000))
        sub.setsockopt(zmq.RECONNECT_IVL_MAX, int(RECONNECT_S[1] * 1000))
        sub.setsockopt(zmq.HEARTBEAT_IVL, int(HEARTBEAT_S[0] * 1000))
        sub.setsockopt(zmq.HEARTBEAT_TIMEOUT, int(HEARTBEAT_S[1] * 1000))
        sub.setsockopt(zmq.SUBSCRIBE, self.settings.topic.encode())
        monitor = sub.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        try:
            sub.connect(url)
            poller = zmq.asyncio.Poller()
            poller.register(sub, zmq.POLLIN)
            poller.register(monitor, zmq.POLLIN)
            while True:
                ready = dict(await poller.poll())
                if monitor in ready:
                    for event in await _drain(monitor):
                        kind = zmq.utils.monitor.parse_monitor_message(event)["event"]
                        await self._on_connection(kind, stream)
                if sub in ready:
                    for frames in await _drain(sub):
                        await self._on_frames(frames, stream)
        finally:
            sub.disable_monitor()
            monitor.close(linger=0)
            sub.close(linger=0)

    async def _on_connection(self, event: int, stream: _Stream) -> None:
        if event == zmq.EVENT_DISCONNECTED:
            self.counters.disconnects += 1
            self.index.suspend(stream.address)
        elif event == zmq.EVENT_CONNECTED and stream.replay is not None:
            # no need to wait for the next message: ask what we may have missed
            await self._recover(stream, stream.expected or 0, None)

    async def _on_frames(self, frames: Sequence[bytes], stream: _Stream) -> None:
        address = stream.address
        try:
            message = decode_message(frames)
        except KvEventDecodeError as exc:
            self.counters.decode_errors += 1
            log.debug("undecodable KV-event message from %s: %s", address, exc)
            self._lost(stream, _seq_or_none(frames))
            return
        seq = message.seq
        kind = step(stream.expected, seq, stream.replayed_upto)
        if kind is Step.DUPLICATE:
            return
        stream.replayed_upto = -1  # past the replay: a smaller number is a restart again
        if kind is Step.NEXT:
            self.index.resume(address)
        elif kind in (Step.FIRST, Step.RESTART) and seq == 0:
            self.counters.restarts += kind is Step.RESTART
            self.index.reset(address, self._clock(), complete=True)
        else:
            self.counters.gaps += kind is Step.GAP
            self.counters.restarts += kind is Step.RESTART
            start = stream.expected if kind is Step.GAP and stream.expected is not None else 0
            await self._recover(stream, start, seq)
        self._apply(stream, message)

    def _apply(self, stream: _Stream, message: KvMessage) -> None:
        batch = message.batch
        c = self.counters
        c.messages += 1
        c.events += len(batch.events)
        c.unknown_events += batch.unknown_events
        c.unknown_fields += batch.unknown_fields
        self.index.apply(stream.address, batch.events, self._clock())
        stream.expected = message.seq + 1

    def _lost(self, stream: _Stream, seq: int | None) -> None:
        """A message could not be applied: the endpoint's view is incomplete."""
        self.index.reset(stream.address, self._clock(), complete=False)
        stream.expected = None if seq is None else seq + 1

    async def _recover(self, stream: _Stream, start: int, upto: int | None) -> None:
        """Fill ``start`` .. ``upto`` (exclusive; None: all the server buffered) from the
        replay socket; what cannot be filled resets the endpoint's view."""
        address, now = stream.address, self._clock()
        batches = None if stream.replay is None else await self._replay(stream.replay, start)
        if batches is None:
            self.counters.replays_failed += stream.replay is not None
            if upto is not None:
                self.index.reset(address, now, complete=False)
            return
        wanted = [(s, p) for s, p in batches if s >= start and (upto is None or s < upto)]
        end = upto if upto is not None else start + len(wanted)
        if [s for s, _ in wanted] == list(range(start, end)):
            self.counters.replays += 1
            if start == 0:  # the publisher's whole history
                self.index.reset(address, now, complete=True)
            else:
                self.index.resume(address)
        else:
            self.counters.replays_partial += 1
            self.index.reset(address, now, complete=False)
        for seq, payload in wanted:
            try:
                batch = decode_batch(payload)
            except KvEventDecodeError:
                self.counters.decode_errors += 1
                self._lost(stream, seq)
                continue
            self._apply(stream, KvMessage(b"", seq, batch))
            stream.replayed_upto = max(stream.replayed_upto, seq)
        if upto is None and not wanted:
            stream.expected = start

    async def _replay(self, url: str, start: int) -> list[tuple[int, bytes]] | None:
        """Everything the server's replay socket still holds from ``start`` on, or None
        when it does not answer properly."""
        assert self._context is not None
        sock = self._context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.IPV6, 1)
        found: list[tuple[int, bytes]] = []
        try:
            sock.connect(url)
            await sock.send_multipart([b"", start.to_bytes(8, "big")])
            while True:
                frames = await asyncio.wait_for(sock.recv_multipart(), self._replay_timeout_s)
                # vLLM 0.32 answers (empty delimiter, topic, sequence, payload); the
                # end marker has an empty topic and payload
                if len(frames) != 4:
                    return None
                seq = sequence_number(frames[2])
                if seq == END_OF_REPLAY:
                    return found
                found.append((seq, frames[3]))
        except (TimeoutError, KvEventDecodeError, zmq.ZMQError) as exc:
            log.debug("replay from %s failed: %r", url, exc)
            return None
        finally:
            sock.close(linger=0)


async def _drain(sock: zmq.asyncio.Socket) -> list[list[bytes]]:
    """Every message waiting on ``sock`` (the poller said there is one), without
    waiting for more: a non-blocking receive resolves at once."""
    found: list[list[bytes]] = []
    while True:
        try:
            found.append(await sock.recv_multipart(zmq.NOBLOCK))
        except zmq.Again:
            return found


def _seq_or_none(frames: Sequence[bytes]) -> int | None:
    try:
        seq = sequence_number(frames[1]) if len(frames) == 3 else None
    except KvEventDecodeError:
        return None
    return seq if seq is not None and seq >= 0 else None


def kv_event_subscribers(
    datastore: Datastore, registry: CollectorRegistry, plugins: Mapping[str, object]
) -> dict[str, KvEventSubscribers]:
    """Subscribers (not started) for every plugin that wants KV events, by plugin name,
    with their counters exported."""
    made = {
        name: KvEventSubscribers(datastore, plugin.index, plugin.events)
        for name, plugin in plugins.items()
        if isinstance(plugin, KvEventSource)
    }
    if made:
        registry.register(KvEventsCollector(made))
    return made


class KvEventsCollector(Collector):
    """Reads the subscribers' counters and the indexes' sizes at scrape time."""

    def __init__(self, sources: Mapping[str, KvEventSubscribers]) -> None:
        self._sources = dict(sources)

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        counted = CounterMetricFamily(
            "epp_kv_event",
            "KV-event stream counters by plugin and kind: messages, events, gaps "
            "(sequence numbers skipped), decode_errors, unknown_events, unknown_fields, "
            "restarts (a publisher started over), disconnects, replays (gaps filled), "
            "replays_partial, replays_failed, failures.",
            labels=["plugin", "kind"],
        )
        index_counts = CounterMetricFamily(
            "epp_kv_index_blocks_changed",
            "Blocks the precise index applied, by plugin and kind: stored, removed, "
            "removed_unknown (never seen stored), orphans (parent unknown: events were "
            "missed), dropped (over maxBlocksPerEndpoint), other_groups (ignored), cleared "
            "(AllBlocksCleared events).",
            labels=["plugin", "kind"],
        )
        blocks = GaugeMetricFamily(
            "epp_kv_index_blocks",
            "Blocks the precise index holds, by plugin, endpoint and medium (GPU, other): "
            "its memory is proportional to the sum.",
            labels=["plugin", "endpoint", "medium"],
        )
        endpoints = GaugeMetricFamily(
            "epp_kv_index_endpoints",
            "Endpoints in the precise index, by plugin and whether their view is trusted "
            "(untrusted ones are scored approximately).",
            labels=["plugin", "state"],
        )
        now = time.monotonic()
        for name, source in sorted(self._sources.items()):
            for f in fields(source.counters):
                counted.add_metric([name, f.name], getattr(source.counters, f.name))
            stats = source.index.stats
            for f in fields(stats):
                index_counts.add_metric([name, f.name], getattr(stats, f.name))
            index = source.index
            for address in sorted(index.addresses()):
                gpu, other = index.blocks(address)
                blocks.add_metric([name, address, "GPU"], gpu)
                blocks.add_metric([name, address, "other"], other)
            trusted = len(index.trusted(now))
            endpoints.add_metric([name, "trusted"], trusted)
            endpoints.add_metric([name, "untrusted"], len(index.addresses()) - trusted)
        yield counted
        yield index_counts
        yield blocks
        yield endpoints
