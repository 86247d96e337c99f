"""Flow control at the edge: a request with no room waits here (its ext_proc stream
stays open, nothing goes upstream) and is dispatched, that is scheduled with the state
of that moment, when room frees. The order and the limits are
:mod:`epp.flowcontrol.queues`'s; this module does the waiting (asyncio), the timers
and the counting.

Room is looked at again when an in-flight request ends (the datastore says so), on a
short poll while anything waits (load reports change room too), and at each arrival.
When nothing waits and the pool has room, a request never comes here unless it waits
for its preferred endpoint (:class:`~epp.flowcontrol.holding.Hold`).

Each pass walks the held requests in their dispatch order (bands, fairness, deadline):
one whose preferred endpoint has room goes; one that waits for its preferred endpoint
stays, counted as ahead of the later ones that want the same endpoint, and is asked
again after the rest of its band, when it may go to the best endpoint still with room
(a free slot goes to a request that prefers it before one that would miss its cache
there); one whose endpoints (its subset) have no room stays without stopping the
others. A pass looks at ``SCAN`` requests at most, and ends early when the pool has no
room at all; another follows while passes dispatch.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from epp.datastore import Datastore
from epp.errors import ClientVisibleError, QueueFullError, QueueTimeoutError, ShuttingDownError
from epp.flowcontrol.holding import Hold
from epp.flowcontrol.queues import FlowControlConfig, FlowQueues, Held
from epp.flowcontrol.saturation import Room
from epp.observability.metrics import EppMetrics
from epp.types import InferenceRequest

log = logging.getLogger(__name__)

T = TypeVar("T")
# while requests wait, room is checked at least this often (load reports free it too)
POLL_S = 0.05
# held requests one pass looks at (in dispatch order): bounds its work when many wait
# for busy endpoints
SCAN = 16
# the llm-d Router's outcome names (the queue duration histogram's label)
DISPATCHED = "Dispatched"
REJECTED_CAPACITY = "RejectedCapacity"
REJECTED_OTHER = "RejectedOther"
EVICTED_TTL = "EvictedTTL"
EVICTED_CANCELLED = "EvictedContextCancelled"
EVICTED_CAPACITY = "EvictedCapacity"
EVICTED_OTHER = "EvictedOther"


@dataclass(slots=True)
class _Waiter(Generic[T]):
    future: asyncio.Future[T]
    room: Callable[[], Room]
    dispatch: Callable[[float, Room, Mapping[str, int], bool], T | Hold]
    fairness_id: str
    narrowed: bool  # it may go to some endpoints only (the proxy's subset hint)


@dataclass(frozen=True, slots=True)
class Waiting(Generic[T]):
    """A held request: ``result`` resolves when it is dispatched (or raises the error
    the client gets); ``limit_s`` is its time limit in the queue."""

    result: Awaitable[T]
    limit_s: float


class FlowController:
    def __init__(
        self,
        cfg: FlowControlConfig,
        metrics: EppMetrics,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cfg = cfg
        self.queues = FlowQueues(cfg)
        self._metrics = metrics
        self._clock = clock
        self._closed = False
        self._pump_soon: asyncio.Handle | None = None
        self._timer: asyncio.TimerHandle | None = None
        # the pool has no endpoint (see follow)
        self._pool_empty: Callable[[], bool] = lambda: False
        metrics.report_flow_queues(self.queues.sizes)

    def follow(self, datastore: Datastore) -> None:
        """Watch ``datastore``: its in-flight releases may free room, and whether it has
        endpoints decides a timed-out request's status."""
        datastore.on_release(self.released)
        self._pool_empty = lambda: not datastore.snapshot().endpoints

    @property
    def idle(self) -> bool:
        """Nothing waits: a request with room goes at once."""
        return not self.queues.count

    def observe(self, fairness_id: str, band: int, outcome: str, waited_s: float) -> None:
        self._metrics.flow_queue_seconds.labels(fairness_id, str(band), outcome).observe(waited_s)

    def enqueue(
        self,
        request: InferenceRequest,
        size: int,
        band: int,
        fairness_id: str,
        limit_s: float,
        room: Callable[[], Room],
        dispatch: Callable[[float, Room, Mapping[str, int], bool], T | Hold],
        release: Callable[[T], None],
    ) -> T | Waiting[T]:
        """Hold the request until ``room()`` (which endpoints have room: none is falsy),
        then ``dispatch(waited, room, held_for, spill)`` it (``held_for``: address ->
        requests ahead of it that wait for that endpoint; ``spill`` False: answer
        :class:`Hold` rather than go elsewhere), unless that answers :class:`Hold`. Its
        result comes back at once if it could go at once (nothing ahead of it and room),
        else as :class:`Waiting`. ``release`` undoes a dispatch whose client left
        before it saw it. Raises QueueFullError when the request cannot be held."""
        if self._closed:
            raise self._shutting_down()
        now = self._clock()
        slo = request.slo_ttft_ms
        due = now + (slo / 1000.0 if slo is not None else self.cfg.queue_timeout_s)
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        waiter = _Waiter(future, room, dispatch, fairness_id, request.subset is not None)
        item = Held(band, fairness_id, size, now, now + limit_s, due, waiter)
        try:
            displaced = self.queues.offer(item)
        except QueueFullError:
            self.observe(fairness_id, band, REJECTED_CAPACITY, 0.0)
            raise
        for other in displaced:
            self._fail(
                other,
                EVICTED_CAPACITY,
                QueueFullError(
                    "the flow-control queue is full and a request of a higher priority "
                    "took this one's place; retry later",
                    code="queue_full",
                    retry_after_s=self.cfg.retry_after_s,
                ),
                now,
            )
        self.pump()
        if future.done():
            return future.result()  # dispatched at once (or raises its error)
        return Waiting(self._wait(item, future, release), limit_s)

    async def _wait(self, item: Held, future: asyncio.Future[T], release: Callable[[T], None]) -> T:
        try:
            return await future
        except asyncio.CancelledError:  # the client left (Envoy closed the stream)
            if future.done() and not future.cancelled() and future.exception() is None:
                release(future.result())  # dispatched just before: undo its claim
            elif self.queues.remove(item):
                waiter: _Waiter[T] = item.payload
                waited = self._clock() - item.enqueued_at
                self.observe(waiter.fairness_id, item.band, EVICTED_CANCELLED, waited)
            raise

    def released(self) -> None:
        """An in-flight request ended somewhere: room may have freed (called by the
        datastore; dispatching waits for the next loop turn, once per turn)."""
        if self.queues.count and self._pump_soon is None:
            self._pump_soon = asyncio.get_running_loop().call_soon(self.pump)

    def pump(self) -> None:
        """Time out what waited too long, then dispatch in order while there is room."""
        self._pump_soon = None
        queues = self.queues
        now = self._clock()
        for item in queues.expired(now):
            self._fail(
                item,
                EVICTED_TTL,
                QueueTimeoutError(
                    f"the request waited {now - item.enqueued_at:.1f}s in the flow-control "
                    "queue, its limit, without room on any endpoint; retry later",
                    pool_empty=self._pool_empty(),
                    code="queue_timeout",
                    retry_after_s=self.cfg.retry_after_s,
                ),
                now,
            )
        while self._pass(now):
            pass
        self._arm()

    def _pass(self, now: float) -> bool:
        """One walk over the first held requests in dispatch order (the module's
        docstring); True when another may dispatch more (this one stopped at its
        bound after dispatching some). Inside a band, a request whose preferred
        endpoint is full is asked again only after the requests behind it had theirs
        (:meth:`_spill`): a free slot goes to a request that prefers it before one
        that would go there for want of its own."""
        queues = self.queues
        batch = queues.ordered(SCAN)
        held_for: dict[str, int] = {}
        went = 0
        deferred: list[tuple[Held, dict[str, int], str]] = []
        band = None
        for item in batch:
            if item.band != band:  # the band above is done: its spills go first
                went += self._spill(deferred, now, held_for)
                deferred, band = [], item.band
            waiter: _Waiter[object] = item.payload
            if waiter.future.done():  # its client left (its coroutine finds it gone)
                queues.remove(item)
                self.observe(
                    waiter.fairness_id, item.band, EVICTED_CANCELLED, now - item.enqueued_at
                )
                continue
            room = waiter.room()
            if not room:
                if not waiter.narrowed:
                    return False  # no endpoint of the pool has room
                continue  # its subset is full: the others may still go
            outcome = self._try(item, now, room, held_for, False)
            if isinstance(outcome, Hold):  # waits for its endpoint, ahead of later ones
                deferred.append((item, dict(held_for), outcome.address))
                held_for[outcome.address] = held_for.get(outcome.address, 0) + 1
            else:
                went += outcome
        went += self._spill(deferred, now, held_for)
        return went > 0 and len(batch) == SCAN

    def _spill(
        self, deferred: list[tuple[Held, dict[str, int], str]], now: float, held_for: dict[str, int]
    ) -> int:
        """The second look at a band's requests that wait for a full endpoint (each
        with the requests held ahead of it then, and that endpoint): in order, each
        waits on or goes to the best endpoint that still has room. Returns how many
        went."""
        went = 0
        left: dict[str, int] = {}  # requests that no longer wait for an endpoint
        for item, ahead, home in deferred:
            waiter: _Waiter[object] = item.payload
            if waiter.future.done():
                continue
            room = waiter.room()
            if not room:
                if not waiter.narrowed:
                    break
                continue
            still = {a: n - left.get(a, 0) for a, n in ahead.items()}
            outcome = self._try(item, now, room, still, True)
            if isinstance(outcome, Hold):
                continue
            went += outcome
            held_for[home] -= 1
            left[home] = left.get(home, 0) + 1
        return went

    def _try(
        self, item: Held, now: float, room: Room, held_for: Mapping[str, int], spill: bool
    ) -> Hold | bool:
        """Dispatch ``item`` (taken out and answered: True) unless it waits for an
        endpoint (:class:`Hold`); False when it was refused (answered its error)."""
        queues = self.queues
        waiter: _Waiter[object] = item.payload
        waited = now - item.enqueued_at
        try:
            result = waiter.dispatch(waited, room, held_for, spill)
        except ClientVisibleError as error:
            queues.pop(item)
            self.observe(waiter.fairness_id, item.band, REJECTED_OTHER, waited)
            waiter.future.set_exception(error)
            return False
        except Exception:
            queues.pop(item)
            log.exception("flow control: dispatching a held request failed")
            self.observe(waiter.fairness_id, item.band, EVICTED_OTHER, waited)
            waiter.future.set_exception(ClientVisibleError("internal error in the endpoint picker"))
            return False
        if isinstance(result, Hold):
            return result
        queues.pop(item)
        self.observe(waiter.fairness_id, item.band, DISPATCHED, waited)
        waiter.future.set_result(result)
        return True

    def _arm(self) -> None:
        """While anything waits, look again at the next time limit or after POLL_S."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self.queues.count:
            return
        delay = POLL_S
        expiry = self.queues.next_expiry()
        if expiry is not None:
            delay = max(0.0, min(delay, expiry - self._clock()))
        self._timer = asyncio.get_running_loop().call_later(delay, self.pump)

    def _fail(self, item: Held, outcome: str, error: ClientVisibleError, now: float) -> None:
        """Answer a request that left the queue (already taken out) with ``error``."""
        waiter: _Waiter[object] = item.payload
        self.observe(waiter.fairness_id, item.band, outcome, now - item.enqueued_at)
        if not waiter.future.done():
            waiter.future.set_exception(error)

    def close(self) -> None:
        """Shutdown: answer every held request 503 ``shutting_down`` (with Retry-After,
        so clients retry on another replica) and hold no new one."""
        self._closed = True
        now = self._clock()
        for item in self.queues.drain():
            self._fail(item, EVICTED_OTHER, self._shutting_down(), now)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _shutting_down(self) -> ShuttingDownError:
        return ShuttingDownError(
            "the endpoint picker is shutting down; retry",
            code="shutting_down",
            retry_after_s=self.cfg.retry_after_s,
        )

    def status(self) -> dict[str, Any]:
        """What /status shows: totals and each (band, flow) queue."""
        return {
            "enabled": self.cfg.enabled,
            "requests": self.queues.count,
            "bytes": self.queues.size,
            "queues": [
                {"priority": band, "fairness_id": flow, "requests": n, "bytes": b}
                for (band, flow), (n, b) in sorted(self.queues.sizes().items(), reverse=True)
            ],
        }
