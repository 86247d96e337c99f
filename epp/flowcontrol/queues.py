"""Flow control's queues, pure: which held request goes next, which limits a new one
hits, which ones ran out of time. No clock of its own (callers pass ``now``), no
asyncio: the waiting lives in :mod:`epp.flowcontrol.controller`.

Order, from the top:

* **Bands**: a request's priority (``x-gateway-inference-priority``, an objective's
  mapping, else the default) is its band; a higher band always goes first.
* **Flows** inside a band, keyed by the fairness id (``x-llm-d-inference-fairness-id``);
  a fairness policy picks the flow (default ``round-robin``: one request per flow in
  turn, a flow that had nothing waiting first, so a flooding flow cannot starve a light
  one).
* **Inside a flow**, earliest deadline first: a request with a TTFT objective is due at
  arrival + that objective, any other at arrival + the default queue time limit, so
  requests without objectives keep their arrival order (FCFS).

Limits (requests and bytes, per band and over all bands): a request that would pass a
band limit is refused; one that would pass a global limit displaces the newest request
of the lowest band below its own, if there is one, else is refused. Each held request
has a time limit, after which it leaves with ``queue_timeout``.
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from epp.common.sections import setting
from epp.errors import QueueFullError

FAIRNESS_HEADERS = ("x-llm-d-inference-fairness-id", "x-gateway-inference-fairness-id")
# a held request's own time limit, in milliseconds (capped by maxQueueTimeoutSeconds)
QUEUE_TIMEOUT_HEADER = "x-epp-queue-timeout-ms"
DEFAULT_FLOW = ""


class FairnessPolicy(Protocol):
    """Chooses which flow of a band sends next. ``flows`` holds the band's non-empty
    flows in the order they became non-empty (or were last rotated); the policy may
    reorder it in :meth:`dispatched`. A policy that reads :attr:`FlowQueue.in_flight`
    sets ``counts_in_flight = True``; for the others (an installed policy without the
    attribute too) nothing counts it, off the request path (it stays 0)."""

    counts_in_flight: bool

    def pick(self, flows: OrderedDict[str, FlowQueue]) -> FlowQueue: ...

    def activated(self, flows: OrderedDict[str, FlowQueue], flow: FlowQueue) -> None:
        """``flow`` just became non-empty (it is the last of ``flows``)."""

    def dispatched(self, flows: OrderedDict[str, FlowQueue], flow: FlowQueue) -> None: ...


class RoundRobin:
    """One request per flow in turn; a flow that had nothing waiting goes first (so a
    light tenant's request waits for the next free slot, not for a whole round)."""

    counts_in_flight = False

    def pick(self, flows: OrderedDict[str, FlowQueue]) -> FlowQueue:
        return next(iter(flows.values()))

    def activated(self, flows: OrderedDict[str, FlowQueue], flow: FlowQueue) -> None:
        flows.move_to_end(flow.id, last=False)

    def dispatched(self, flows: OrderedDict[str, FlowQueue], flow: FlowQueue) -> None:
        if flow.id in flows:
            flows.move_to_end(flow.id)


class FairShare(RoundRobin):
    """Round robin that counts the flows' requests in flight: the flow with the fewest
    dispatched and not yet ended goes first (ties: round robin's order). While flows
    are backlogged they share the pool's slots equally (max-min fair), whatever the
    length of their requests; a flow that sends below its share has its requests, a
    burst included, dispatched at the next free slots, and the flows above it get the
    rest."""

    counts_in_flight = True

    def pick(self, flows: OrderedDict[str, FlowQueue]) -> FlowQueue:
        return min(flows.values(), key=lambda f: f.in_flight)


class GlobalEdf:
    """No fairness between flows: the band's most urgent request first (FCFS when no
    request has an objective)."""

    counts_in_flight = False

    def pick(self, flows: OrderedDict[str, FlowQueue]) -> FlowQueue:
        return min(flows.values(), key=lambda f: f.head_key())

    def activated(self, flows: OrderedDict[str, FlowQueue], flow: FlowQueue) -> None:
        pass

    def dispatched(self, flows: OrderedDict[str, FlowQueue], flow: FlowQueue) -> None:
        pass


# fairness policy name -> factory; register_fairness_policy adds one (a plugin package
# calls it from its entry point's module, like a plugin type)
FAIRNESS_POLICIES: dict[str, Callable[[], FairnessPolicy]] = {
    "round-robin": RoundRobin,
    "fair-share": FairShare,
    "global-edf": GlobalEdf,
}


def register_fairness_policy(name: str, factory: Callable[[], FairnessPolicy]) -> None:
    if name in FAIRNESS_POLICIES:
        raise ValueError(f"fairness policy {name!r} registered twice")
    FAIRNESS_POLICIES[name] = factory


@dataclass(frozen=True)
class FlowControlConfig:
    """Flow control: requests wait in the EPP while no endpoint has room.

    They wait in priority bands, fair across fairness ids (docs/flow-control.md)."""

    enabled: bool = setting(
        True,
        "enabled",
        "hold requests while no endpoint has room (false: route every request at once, "
        "as the servers' own queues absorb the overload; docs/flow-control.md)",
    )
    keep_affinity: bool = setting(
        True,
        "keepAffinity",
        "a held request waits for the endpoint the scheduler prefers while that is "
        "predicted sooner than a miss where there is room; false: the best with room",
    )
    fairness_policy: str = setting(
        "round-robin",
        "fairnessPolicy",
        "how flows of one band share dispatches",
        choices=FAIRNESS_POLICIES.keys(),
    )
    queue_timeout_s: float = setting(
        30.0,
        "queueTimeoutSeconds",
        "how long a request may wait (429 queue_timeout)",
        minimum=0.001,
    )
    max_queue_timeout_s: float = setting(
        120.0,
        "maxQueueTimeoutSeconds",
        f"the most a {QUEUE_TIMEOUT_HEADER} header may ask for",
        minimum=0.001,
    )
    max_requests: int = setting(
        5000, "maxRequests", "requests held over all bands (429 queue_full)", minimum=1
    )
    max_bytes: int = setting(
        1 << 30, "maxBytes", "request body bytes held over all bands", minimum=1
    )
    band_max_requests: int = setting(
        2000, "bandMaxRequests", "requests held in one band", minimum=1
    )
    band_max_bytes: int = setting(
        512 << 20, "bandMaxBytes", "request body bytes held in one band", minimum=1
    )
    shed_sheddable: bool = setting(
        False, "shedSheddable", "answer 429 to sheddable requests (priority < 0) at once"
    )
    retry_after_s: int = setting(
        1, "retryAfterSeconds", "the Retry-After of queue_full and queue_timeout", minimum=0
    )
    message_timeout_margin_s: float = setting(
        30.0,
        "messageTimeoutMarginSeconds",
        "what a request may need after its dispatch (a prefill leg): added to a held "
        "request's time limit in the ext_proc timeout asked of Envoy",
        minimum=0.0,
    )


@dataclass(eq=False, slots=True)
class Held:
    """One waiting request: where it waits, what it weighs, when it is due."""

    band: int
    flow: str
    size: int
    enqueued_at: float
    expires_at: float
    key: float  # its deadline: the order inside its flow
    payload: Any = None
    seq: int = 0
    queued: bool = False


class FlowQueue:
    """One flow's held requests, earliest deadline first; ``in_flight``: the flow's
    requests dispatched and not yet ended (over all bands)."""

    __slots__ = ("_heap", "count", "id", "in_flight", "size")

    def __init__(self, flow_id: str, in_flight: int = 0) -> None:
        self.id = flow_id
        self._heap: list[tuple[float, int, Held]] = []
        self.count = 0
        self.size = 0
        self.in_flight = in_flight

    def push(self, item: Held) -> None:
        heapq.heappush(self._heap, (item.key, item.seq, item))
        self.count += 1
        self.size += item.size

    def head(self) -> Held:
        heap = self._heap
        while not heap[0][2].queued:  # left already (removed lazily)
            heapq.heappop(heap)
        return heap[0][2]

    def head_key(self) -> tuple[float, int]:
        head = self.head()
        return head.key, head.seq

    def discount(self, item: Held) -> None:
        self.count -= 1
        self.size -= item.size
        if not self.count:
            self._heap.clear()


class _Preview(FlowQueue):
    """A flow's held requests read in order without taking any out: a walk down its
    heap (a frontier of the smallest entries not yet read)."""

    __slots__ = ("_frontier", "_next")

    def __init__(self, flow: FlowQueue) -> None:
        super().__init__(flow.id, flow.in_flight)
        self._heap = flow._heap
        self.count = flow.count
        self._frontier: list[tuple[float, int, int]] = []
        if self._heap:
            self._frontier.append((self._heap[0][0], self._heap[0][1], 0))
        self._next: Held | None = None

    def head(self) -> Held:
        if self._next is None:
            self._next = self._read()
        return self._next

    def take(self) -> Held:
        item = self.head()
        self._next = None
        self.count -= 1
        return item

    def _read(self) -> Held:
        heap, frontier = self._heap, self._frontier
        while True:
            _, _, i = heapq.heappop(frontier)
            for child in (2 * i + 1, 2 * i + 2):
                if child < len(heap):
                    key, seq, _ = heap[child]
                    heapq.heappush(frontier, (key, seq, child))
            item = heap[i][2]
            if item.queued:
                return item


@dataclass
class Band:
    priority: int
    flows: OrderedDict[str, FlowQueue] = field(default_factory=OrderedDict)
    count: int = 0
    size: int = 0


class FlowQueues:
    def __init__(self, cfg: FlowControlConfig, policy: FairnessPolicy | None = None) -> None:
        self.cfg = cfg
        self.policy = policy or FAIRNESS_POLICIES[cfg.fairness_policy]()
        self._bands: dict[int, Band] = {}
        self._order: list[int] = []  # band priorities, highest first
        self._expiry: list[tuple[float, int, Held]] = []
        self._seq = itertools.count()
        self.count = 0
        self.size = 0
        self._in_flight: dict[str, int] = {}  # flow -> requests dispatched, not ended

    def __len__(self) -> int:
        return self.count

    # -- in flight -------------------------------------------------------------------------
    def started(self, flow_id: str) -> None:
        """A request of ``flow_id`` was dispatched (from the queue or at once)."""
        self._count(flow_id, 1)

    def ended(self, flow_id: str) -> None:
        """A request of ``flow_id`` that :meth:`started` is no longer in flight."""
        self._count(flow_id, -1)

    def in_flight(self, flow_id: str) -> int:
        return self._in_flight.get(flow_id, 0)

    def _count(self, flow_id: str, delta: int) -> None:
        n = self._in_flight.get(flow_id, 0) + delta
        if n > 0:
            self._in_flight[flow_id] = n
        else:
            self._in_flight.pop(flow_id, None)
        for band in self._bands.values():
            flow = band.flows.get(flow_id)
            if flow is not None:
                flow.in_flight = max(n, 0)

    # -- in ------------------------------------------------------------------------------
    def offer(self, item: Held) -> list[Held]:
        """Hold ``item``; returns the requests it displaced (they leave with
        ``queue_full``). Raises QueueFullError when it cannot be held."""
        cfg = self.cfg
        band = self._bands.get(item.band)
        if band is not None and (
            band.count + 1 > cfg.band_max_requests or band.size + item.size > cfg.band_max_bytes
        ):
            raise self._full("band")
        if item.size > cfg.band_max_bytes:
            raise self._full("band")
        displaced = self._make_room(item)
        self._push(item)
        return displaced

    def _full(self, scope: str) -> QueueFullError:
        return QueueFullError(
            f"the flow-control queue is full ({scope} limit); retry later",
            code="queue_full",
            retry_after_s=self.cfg.retry_after_s,
        )

    def _make_room(self, item: Held) -> list[Held]:
        cfg = self.cfg
        if self.count + 1 <= cfg.max_requests and self.size + item.size <= cfg.max_bytes:
            return []
        victims: list[Held] = []
        count, size = self.count, self.size
        for priority in reversed(self._order):  # lowest band first
            if priority >= item.band:
                break
            for victim in self._newest_first(self._bands[priority]):
                victims.append(victim)
                count, size = count - 1, size - victim.size
                if count + 1 <= cfg.max_requests and size + item.size <= cfg.max_bytes:
                    for v in victims:
                        self.remove(v)
                    return victims
        raise self._full("global")

    @staticmethod
    def _newest_first(band: Band) -> Iterator[Held]:
        items = [i for f in band.flows.values() for _, _, i in f._heap if i.queued]
        return iter(sorted(items, key=lambda i: i.seq, reverse=True))

    def _push(self, item: Held) -> None:
        item.seq = next(self._seq)
        item.queued = True
        band = self._bands.get(item.band)
        if band is None:
            band = self._bands[item.band] = Band(item.band)
            self._order = sorted(self._bands, reverse=True)
        flow = band.flows.get(item.flow)
        if flow is None:
            flow = band.flows[item.flow] = FlowQueue(item.flow, self.in_flight(item.flow))
            self.policy.activated(band.flows, flow)
        flow.push(item)
        band.count += 1
        band.size += item.size
        self.count += 1
        self.size += item.size
        heapq.heappush(self._expiry, (item.expires_at, item.seq, item))

    # -- out -----------------------------------------------------------------------------
    def peek(self) -> Held | None:
        """The request that goes next (it stays held until :meth:`pop`)."""
        if not self.count:
            return None
        band = self._bands[self._order[0]]
        return self.policy.pick(band.flows).head()

    def ordered(self, limit: int) -> list[Held]:
        """The first ``limit`` held requests in the order they would be dispatched,
        none taken out: the fairness policy runs on a copy of each band's flows, so it
        must keep its state in their order (as the built-in policies do)."""
        out: list[Held] = []
        for priority in self._order:
            flows: OrderedDict[str, FlowQueue] = OrderedDict(
                (flow_id, _Preview(flow)) for flow_id, flow in self._bands[priority].flows.items()
            )
            while flows:
                if len(out) >= limit:
                    return out
                flow = self.policy.pick(flows)
                assert isinstance(flow, _Preview)
                out.append(flow.take())
                flow.in_flight += 1  # as once it is dispatched
                if not flow.count:
                    del flows[flow.id]
                self.policy.dispatched(flows, flow)
        return out

    def pop(self, item: Held) -> None:
        """``item`` (what :meth:`peek` returned) was dispatched."""
        band = self._bands[item.band]
        flow = band.flows[item.flow]
        self.remove(item)
        self.policy.dispatched(band.flows, flow)

    def remove(self, item: Held) -> bool:
        """Take ``item`` out (dispatched, timed out, displaced, its client gone); False
        if it was not held."""
        if not item.queued:
            return False
        item.queued = False
        band = self._bands[item.band]
        flow = band.flows[item.flow]
        flow.discount(item)
        if not flow.count:
            del band.flows[item.flow]
        band.count -= 1
        band.size -= item.size
        if not band.count:
            del self._bands[item.band]
            self._order.remove(item.band)
        self.count -= 1
        self.size -= item.size
        if not self.count:
            self._expiry.clear()
        return True

    def expired(self, now: float) -> list[Held]:
        """Take out and return the requests whose time limit passed."""
        out = []
        heap = self._expiry
        while heap and (heap[0][0] <= now or not heap[0][2].queued):
            _, _, item = heapq.heappop(heap)
            if item.queued:
                self.remove(item)
                out.append(item)
        return out

    def next_expiry(self) -> float | None:
        heap = self._expiry
        while heap and not heap[0][2].queued:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def drain(self) -> list[Held]:
        """Take out every held request (shutdown)."""
        items = sorted(
            (i for b in self._bands.values() for f in b.flows.values() for _, _, i in f._heap),
            key=lambda i: i.seq,
        )
        out = [i for i in items if self.remove(i)]
        return out

    # -- reporting -------------------------------------------------------------------------
    def sizes(self) -> dict[tuple[int, str], tuple[int, int]]:
        """(band, flow) -> (requests, bytes) held."""
        return {
            (b.priority, f.id): (f.count, f.size)
            for b in self._bands.values()
            for f in b.flows.values()
        }


def fairness_id(headers: Mapping[str, str]) -> str:
    for name in FAIRNESS_HEADERS:
        value = headers.get(name)
        if value:
            return value.strip()
    return DEFAULT_FLOW


def queue_timeout(headers: Mapping[str, str], cfg: FlowControlConfig) -> float:
    """The request's time limit in the queue (seconds): its header's, capped, else the
    config's. Raises ValueError for a header that is not a positive number."""
    raw = headers.get(QUEUE_TIMEOUT_HEADER)
    if raw is None:
        return cfg.queue_timeout_s
    try:
        ms = float(raw.strip())
    except ValueError:
        raise ValueError(f"{QUEUE_TIMEOUT_HEADER} must be a number of milliseconds") from None
    if not ms > 0 or ms == float("inf"):
        raise ValueError(f"{QUEUE_TIMEOUT_HEADER} must be a positive number of milliseconds")
    return min(ms / 1000.0, cfg.max_queue_timeout_s)
