"""Flow control's waiting through the real router, datastore and scheduler, with a fake
clock: held while no endpoint has room, dispatched when a request ends, removed when
its client leaves, timed out, answered at shutdown."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from epp.config import build_scheduler
from epp.datastore import Datastore
from epp.errors import (
    SHUTTING_DOWN,
    TTL_EXPIRED,
    QueueTimeoutError,
    ShedError,
    ShuttingDownError,
)
from epp.flowcontrol.controller import Waiting
from epp.flowcontrol.queues import FlowControlConfig
from epp.observability.metrics import EppMetrics
from epp.router import Routed, Router
from epp.types import Endpoint, InferenceRequest
from tests.support.routers import make_router as router_for


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_router(clock: Clock, cfg: FlowControlConfig | None = None, limit: int = 1) -> Router:
    datastore = Datastore(clock=clock)
    datastore.add(Endpoint("10.0.0.1", 8000))
    metrics = EppMetrics(datastore)
    scheduler = build_scheduler(f"saturationDetector: {{maxConcurrency: {limit}}}", clock)
    flow = cfg or FlowControlConfig(enabled=True)
    return router_for(datastore, scheduler, metrics, clock=clock, flow=flow)


def req(name: str, **headers: str) -> InferenceRequest:
    return InferenceRequest(name, "m", "/v1/completions", prompt=name, headers=headers)


def count(router: Router, outcome: str) -> float:
    value = router.metrics.registry.get_sample_value(
        "llm_d_epp_flow_control_request_queue_duration_seconds_count",
        {"fairness_id": "", "priority": "0", "outcome": outcome},
    )
    return value or 0.0


async def test_held_until_a_request_ends_then_dispatched_with_fresh_state() -> None:
    clock = Clock()
    router = make_router(clock)
    first = router.admit(req("a"), 10)
    assert isinstance(first, Routed)  # room: routed at once, nothing held
    second = router.admit(req("b"), 20)
    assert isinstance(second, Waiting) and second.limit_s == 30.0
    assert router.flow.status()["requests"] == 1 and router.flow.queues.size == 20
    task = asyncio.ensure_future(second.result)
    await asyncio.sleep(0)
    assert not task.done()
    clock.now += 2.5
    first.release()  # room frees: dispatched on the next loop turn
    routed = await asyncio.wait_for(task, 1)
    assert routed.ticket.address == "10.0.0.1:8000"
    assert router.datastore.in_flight("10.0.0.1:8000") == 1
    assert router.flow.idle and count(router, "Dispatched") == 2
    routed.release()
    assert router.datastore.in_flight("10.0.0.1:8000") == 0


async def test_a_client_that_leaves_is_removed_at_once() -> None:
    clock = Clock()
    router = make_router(clock)
    first = router.admit(req("a"), 1)
    assert isinstance(first, Routed)
    waiting = router.admit(req("b"), 1)
    assert isinstance(waiting, Waiting)
    task = asyncio.ensure_future(waiting.result)
    await asyncio.sleep(0)
    task.cancel()  # Envoy closed the stream
    with pytest.raises(asyncio.CancelledError):
        await task
    assert router.flow.idle and count(router, "EvictedContextCancelled") == 1
    first.release()
    await asyncio.sleep(0.01)
    assert router.datastore.in_flight("10.0.0.1:8000") == 0


async def test_a_client_that_leaves_just_before_a_pump_is_counted_as_evicted() -> None:
    """Cancelling the waiting task cancels its future at once, its coroutine only on the
    next loop turn: a pump in between takes the request out, and counts it."""
    clock = Clock()
    router = make_router(clock)
    first = router.admit(req("a"), 1)
    waiting = router.admit(req("b"), 1)
    assert isinstance(first, Routed) and isinstance(waiting, Waiting)
    task = asyncio.ensure_future(waiting.result)
    await asyncio.sleep(0)
    task.cancel()  # Envoy closed the stream: the future is cancelled now ...
    router.flow.pump()  # ... and a pump (its timer, a request ending) runs first
    with pytest.raises(asyncio.CancelledError):
        await task
    assert router.flow.idle and count(router, "EvictedContextCancelled") == 1
    first.release()


@pytest.mark.parametrize(
    ("pool_left", "status", "error_type"),
    [(True, 429, "rate_limit_exceeded"), (False, 503, "service_unavailable")],
)
async def test_time_limit_gives_queue_timeout_with_retry_after(
    pool_left: bool, status: int, error_type: str
) -> None:
    clock = Clock()
    router = make_router(clock)
    first = router.admit(req("a"), 1)
    waiting = router.admit(req("b", **{"x-epp-queue-timeout-ms": "50"}), 1)
    assert isinstance(first, Routed) and isinstance(waiting, Waiting)
    assert waiting.limit_s == 0.05
    if not pool_left:  # 429 while the pool has endpoints, else 503
        router.datastore.remove("10.0.0.1:8000")  # draining: its request still runs
    task = asyncio.ensure_future(waiting.result)
    clock.now += 0.06
    with pytest.raises(QueueTimeoutError) as timeout:
        await asyncio.wait_for(task, 1)  # the controller's own timer fires
    error = timeout.value
    assert (error.status, error.code, error.retry_after_s) == (status, "queue_timeout", 1)
    assert (error.error_type, error.dropped_reason) == (error_type, TTL_EXPIRED)
    assert router.flow.idle and count(router, "EvictedTTL") == 1
    first.release()


async def test_priority_band_goes_ahead_and_fairness_ids_alternate() -> None:
    clock = Clock()
    router = make_router(clock)
    first = router.admit(req("running"), 1)
    assert isinstance(first, Routed)
    order: list[str] = []

    async def wait(name: str, **headers: str) -> None:
        held = router.admit(req(name, **headers), 1)
        assert isinstance(held, Waiting)
        routed = await held.result
        order.append(name)
        await asyncio.sleep(0)
        routed.release()

    tasks = [asyncio.ensure_future(wait(f"A{i}", **{"x-llm-d-inference-fairness-id": "A"}))
             for i in range(3)]  # fmt: skip
    tasks.append(asyncio.ensure_future(wait("B0", **{"x-llm-d-inference-fairness-id": "B"})))
    tasks.append(asyncio.ensure_future(wait("crit", **{"x-gateway-inference-priority": "9"})))
    await asyncio.sleep(0)
    first.release()
    await asyncio.wait_for(asyncio.gather(*tasks), 2)
    assert order == ["crit", "B0", "A0", "A1", "A2"]  # B had nothing waiting: first


async def test_fair_share_counts_each_flows_requests_in_flight() -> None:
    clock = Clock()
    router = make_router(clock, FlowControlConfig(enabled=True, fairness_policy="fair-share"), 4)
    queues = router.flow.queues
    a_id, b_id = {"x-llm-d-inference-fairness-id": "A"}, {"x-llm-d-inference-fairness-id": "B"}
    running = [router.admit(req(f"A{i}", **a_id), 1) for i in range(4)]  # at once: room
    assert all(isinstance(r, Routed) for r in running) and queues.in_flight("A") == 4
    names = ("A4", "B0", "B1")
    held = [router.admit(req(n, **(a_id if n[0] == "A" else b_id)), 1) for n in names]
    order: list[str] = []
    routed: list[Routed] = []

    async def wait(name: str, waiting: Routed | Waiting[Routed]) -> None:
        assert isinstance(waiting, Waiting)
        routed.append(await waiting.result)
        order.append(name)

    tasks = [asyncio.ensure_future(wait(n, h)) for n, h in zip(names, held, strict=True)]
    await asyncio.sleep(0)
    for r in running[:2]:
        assert isinstance(r, Routed)
        r.release()
    await asyncio.sleep(0.01)
    # both free slots to B's burst: it has fewer in flight (round robin: B0, then A4)
    assert order == ["B0", "B1"]
    assert queues.in_flight("A") == 2 and queues.in_flight("B") == 2
    routed[0].release()
    await asyncio.wait_for(asyncio.gather(*tasks), 1)
    assert order[-1] == "A4" and queues.in_flight("A") == 3 and queues.in_flight("B") == 1
    for r in [*routed[1:], *running[2:]]:
        assert isinstance(r, Routed)
        r.release()
    assert queues.in_flight("A") == queues.in_flight("B") == 0


def test_round_robin_counts_no_flow_in_flight() -> None:
    """Only a policy that reads the counts pays for them on the request path."""
    router = make_router(Clock(), FlowControlConfig(enabled=True), 4)
    routed = router.admit(req("A0", **{"x-llm-d-inference-fairness-id": "A"}), 1)
    assert isinstance(routed, Routed)
    assert router.flow.queues.in_flight("A") == 0
    routed.release()


async def test_sheddable_and_disabled_and_shutdown() -> None:
    clock = Clock()
    shed = make_router(clock, FlowControlConfig(enabled=True, shed_sheddable=True))
    assert isinstance(shed.admit(req("a"), 1), Routed)
    with pytest.raises(ShedError) as error:
        shed.admit(req("b", **{"x-gateway-inference-priority": "-1"}), 1)
    assert error.value.code == "shed" and error.value.retry_after_s == 1
    off = make_router(clock, replace(FlowControlConfig(), enabled=False))
    assert isinstance(off.admit(req("a"), 1), Routed)
    assert isinstance(off.admit(req("b"), 1), Routed)  # over the limit: sent anyway
    router = make_router(clock)
    assert isinstance(router.admit(req("a"), 1), Routed)
    waiting = router.admit(req("b"), 1)
    assert isinstance(waiting, Waiting)
    router.flow.close()
    with pytest.raises(ShuttingDownError) as closed:
        await waiting.result
    assert closed.value.code == "shutting_down" and closed.value.status == 503
    assert closed.value.dropped_reason == SHUTTING_DOWN
    with pytest.raises(ShuttingDownError):
        router.admit(req("c"), 1)


def test_requests_without_a_body_are_never_held() -> None:
    clock = Clock()
    router = make_router(clock, limit=1)
    router.datastore.acquire("10.0.0.1:8000")  # full
    models = InferenceRequest("r", None, "/v1/models")
    assert isinstance(router.admit(models, 0), Routed)


def two_endpoints(clock: Clock, output_tokens: int = 30) -> Router:
    """Two endpoints of one slot; a slot held 0.61 s by the latency model's priors."""
    datastore = Datastore(clock=clock)
    for host in ("10.0.0.1", "10.0.0.2"):
        datastore.add(Endpoint(host, 8000))
    metrics = EppMetrics(datastore)
    scheduler = build_scheduler(
        "saturationDetector: {maxConcurrency: 1}\n"
        f"latencyModel: {{maxNumSeqs: 1, outputTokens: {output_tokens}}}\n",
        clock,
    )
    flow = FlowControlConfig(enabled=True)
    return router_for(datastore, scheduler, metrics, clock=clock, flow=flow)


HOME, OTHER = "10.0.0.1:8000", "10.0.0.2:8000"
LONG = "x" * 40_000  # cached where it was routed


async def test_a_request_waits_for_its_home_while_a_later_one_goes_elsewhere() -> None:
    clock = Clock()
    router = two_endpoints(clock)
    first = router.admit(replace(req(LONG), subset=frozenset({HOME})), 1)
    assert isinstance(first, Routed) and first.ticket.address == HOME  # its prefix: HOME
    same = router.admit(req(LONG + " more"), 1)  # the scheduler prefers HOME, full
    assert isinstance(same, Waiting)
    other = router.admit(req("another prompt"), 1)  # not behind it: OTHER has room
    assert isinstance(other, Routed) and other.ticket.address == OTHER
    task = asyncio.ensure_future(same.result)
    await asyncio.sleep(0)
    assert not task.done()
    clock.now += 0.3
    first.release()
    routed = await asyncio.wait_for(task, 1)
    assert routed.ticket.address == HOME  # kept its prefix's endpoint
    routed.release()
    other.release()


async def test_a_request_whose_subset_is_full_does_not_block_later_ones() -> None:
    clock = Clock()
    router = two_endpoints(clock)
    first = router.admit(replace(req("a"), subset=frozenset({HOME})), 1)
    narrowed = router.admit(replace(req("b"), subset=frozenset({HOME})), 1)
    assert isinstance(first, Routed) and isinstance(narrowed, Waiting)
    later = router.admit(req("c"), 1)  # HOME is full, OTHER has room: it goes at once
    assert isinstance(later, Routed) and later.ticket.address == OTHER
    first.release()
    routed = await asyncio.wait_for(narrowed.result, 1)
    assert routed.ticket.address == HOME
    routed.release()
    later.release()


async def test_a_free_slot_goes_to_a_request_that_prefers_it_before_a_spill() -> None:
    clock = Clock()
    router = two_endpoints(clock, output_tokens=100)  # a slot held 2 s > a 1 s miss
    cached_other = "y" * 40_000
    at_home = router.admit(replace(req(LONG), subset=frozenset({HOME})), 1)
    at_other = router.admit(replace(req(cached_other), subset=frozenset({OTHER})), 1)
    assert isinstance(at_home, Routed) and isinstance(at_other, Routed)
    spills = router.admit(req(LONG + " more"), 1)  # first in line; HOME's wait > a miss
    prefers_other = router.admit(req(cached_other + " more"), 1)
    assert isinstance(spills, Waiting) and isinstance(prefers_other, Waiting)
    first, second = (
        asyncio.ensure_future(spills.result),
        asyncio.ensure_future(prefers_other.result),
    )
    await asyncio.sleep(0)
    at_other.release()  # OTHER frees: the request whose prefix is there takes it
    routed = await asyncio.wait_for(second, 1)
    assert routed.ticket.address == OTHER and not first.done()
    at_home.release()
    assert (await asyncio.wait_for(first, 1)).ticket.address == HOME
