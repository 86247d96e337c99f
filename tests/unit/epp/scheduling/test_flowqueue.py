"""Flow control's queues on plain data with a fake clock: bands, fairness across flows,
FCFS/EDF inside a flow, limits, time limits."""

from __future__ import annotations

from dataclasses import replace

import pytest

from epp.errors import QueueFullError
from epp.flowcontrol.queues import (
    FlowControlConfig,
    FlowQueues,
    Held,
    fairness_id,
    queue_timeout,
)

CFG = FlowControlConfig(enabled=True)


def held(name: str, band: int = 0, flow: str = "", at: float = 0.0, size: int = 1,
         limit: float = 30.0, due: float | None = None) -> Held:  # fmt: skip
    return Held(band, flow, size, at, at + limit, at + limit if due is None else due, name)


def drain_order(q: FlowQueues) -> list[str]:
    out = []
    while (item := q.peek()) is not None:
        q.pop(item)
        out.append(item.payload)
    return out


def test_a_higher_band_always_goes_first() -> None:
    q = FlowQueues(CFG)
    for i, band in enumerate((0, -1, 0, 5, 0, 5, -1)):
        q.offer(held(f"{band}:{i}", band, at=i))
    assert drain_order(q) == ["5:3", "5:5", "0:0", "0:2", "0:4", "-1:1", "-1:6"]
    assert len(q) == 0 and q.size == 0 and q.sizes() == {}


def test_round_robin_across_flows_fcfs_inside_each() -> None:
    q = FlowQueues(CFG)
    for i in range(6):  # a flood from A, then two from B and one from C
        q.offer(held(f"A{i}", flow="A", at=i))
    q.offer(held("B0", flow="B", at=10))
    q.offer(held("B1", flow="B", at=11))
    q.offer(held("C0", flow="C", at=12))
    # a flow that had nothing waiting goes first, then one request per flow in turn
    assert drain_order(q) == ["C0", "B0", "A0", "B1", "A1", "A2", "A3", "A4", "A5"]
    # a light flow arriving while a flood waits is next, not a round later
    for i in range(4):
        q.offer(held(f"A{i}", flow="A", at=20 + i))
    q.pop(q.peek())  # type: ignore[arg-type]
    q.offer(held("B2", flow="B", at=30))
    assert drain_order(q) == ["B2", "A1", "A2", "A3"]


def test_fair_share_sends_the_flow_with_fewer_in_flight_first() -> None:
    q = FlowQueues(replace(CFG, fairness_policy="fair-share"))
    for _ in range(3):
        q.started("A")  # A has 3 requests running, B none
    for i in range(3):
        q.offer(held(f"A{i}", flow="A", at=i))
    q.offer(held("B0", flow="B", at=10))
    q.offer(held("B1", flow="B", at=11))
    # B's burst goes while B has fewer in flight than A (round robin: B0, A0, B1)
    assert [item.payload for item in q.ordered(5)] == ["B0", "B1", "A0", "A1", "A2"]
    for _ in range(3):
        q.ended("A")
    q.started("B")
    assert q.in_flight("A") == 0 and q.in_flight("B") == 1
    assert [item.payload for item in q.ordered(3)] == ["A0", "B0", "A1"]  # A first now
    q.ended("B")
    assert q.in_flight("B") == 0 and [i.payload for i in q.ordered(2)] == ["B0", "A0"]


def test_global_edf_policy_ignores_flows() -> None:
    q = FlowQueues(replace(CFG, fairness_policy="global-edf"))
    for i in range(3):
        q.offer(held(f"A{i}", flow="A", at=i))
    q.offer(held("B0", flow="B", at=10))
    assert drain_order(q) == ["A0", "A1", "A2", "B0"]


def test_earliest_deadline_first_inside_a_flow() -> None:
    q = FlowQueues(CFG)
    q.offer(held("plain", at=0.0))  # due at 30 (the queue time limit)
    q.offer(held("slo-late", at=1.0, due=20.0))
    q.offer(held("slo-soon", at=2.0, due=2.5))
    assert drain_order(q) == ["slo-soon", "slo-late", "plain"]


def test_band_limits_refuse_in_requests_and_bytes() -> None:
    q = FlowQueues(replace(CFG, band_max_requests=2, band_max_bytes=100))
    q.offer(held("a"))
    q.offer(held("b"))
    with pytest.raises(QueueFullError) as full:
        q.offer(held("c"))
    assert full.value.status == 429 and full.value.code == "queue_full"
    assert "band limit" in full.value.message and full.value.retry_after_s == 1
    q.offer(held("other band", band=1, size=60))
    with pytest.raises(QueueFullError):
        q.offer(held("too big", band=1, size=41))
    with pytest.raises(QueueFullError):
        q.offer(held("bigger than a band", band=2, size=101))
    assert len(q) == 3


def test_global_limit_displaces_the_newest_of_the_lowest_band() -> None:
    q = FlowQueues(replace(CFG, max_requests=3, max_bytes=1000))
    q.offer(held("batch-old", band=-1, at=0))
    q.offer(held("batch-new", band=-1, at=1))
    q.offer(held("std", band=0, at=2))
    [out] = q.offer(held("critical", band=5, at=3))
    assert out.payload == "batch-new" and not out.queued
    with pytest.raises(QueueFullError) as full:  # nothing below its band to displace
        q.offer(held("batch-3", band=-1, at=4))
    assert "global limit" in full.value.message
    displaced = q.offer(held("critical-2", band=5, at=5, size=600))
    assert [d.payload for d in displaced] == ["batch-old"]
    with pytest.raises(QueueFullError):  # bytes: displacing all below is not enough
        q.offer(held("huge", band=5, size=900))
    assert drain_order(q) == ["critical", "critical-2", "std"]


def test_time_limits_expire_in_order_and_skip_what_left() -> None:
    q = FlowQueues(CFG)
    a, b, c = held("a", at=0, limit=1), held("b", at=0, limit=2), held("c", at=0, limit=3)
    for item in (a, b, c):
        q.offer(item)
    assert q.next_expiry() == 1
    assert q.expired(0.5) == []
    assert q.remove(a) and not q.remove(a)  # its client left
    assert q.next_expiry() == 2
    assert [i.payload for i in q.expired(2.0)] == ["b"]
    assert len(q) == 1 and q.peek() is c
    assert [i.payload for i in q.drain()] == ["c"]
    assert q.next_expiry() is None and q.peek() is None


def test_sizes_per_band_and_flow() -> None:
    q = FlowQueues(CFG)
    q.offer(held("a", band=1, flow="x", size=10))
    q.offer(held("b", band=1, flow="x", size=5))
    q.offer(held("c", band=0, flow="y", size=7))
    assert q.sizes() == {(1, "x"): (2, 15), (0, "y"): (1, 7)}
    assert q.count == 3 and q.size == 22


def test_fairness_id_and_queue_timeout_headers() -> None:
    assert fairness_id({}) == ""
    assert fairness_id({"x-gateway-inference-fairness-id": "old"}) == "old"
    both = {"x-llm-d-inference-fairness-id": "new", "x-gateway-inference-fairness-id": "old"}
    assert fairness_id(both) == "new"
    assert queue_timeout({}, CFG) == 30.0
    assert queue_timeout({"x-epp-queue-timeout-ms": "250"}, CFG) == 0.25
    assert queue_timeout({"x-epp-queue-timeout-ms": "9999999"}, CFG) == 120.0  # capped
    for bad in ("soon", "0", "-5", "inf", "nan"):
        with pytest.raises(ValueError, match="x-epp-queue-timeout-ms"):
            queue_timeout({"x-epp-queue-timeout-ms": bad}, CFG)


@pytest.mark.parametrize("policy", ["round-robin", "global-edf"])
def test_ordered_previews_the_dispatch_order_without_taking_any_out(policy: str) -> None:
    q = FlowQueues(replace(CFG, fairness_policy=policy))
    for i in range(7):
        q.offer(held(f"A{i}", flow="A", at=i, due=100 - i if i % 3 == 0 else None))
    for i, band in enumerate((0, 2, 0, -1)):
        q.offer(held(f"B{i}", band, flow="B", at=10 + i))
    removed = held("gone", flow="A", at=3)
    q.offer(removed)
    q.remove(removed)  # left lazily in its flow's heap: skipped
    preview = [item.payload for item in q.ordered(100)]
    assert [item.payload for item in q.ordered(4)] == preview[:4]
    assert len(q) == len(preview) == 11
    assert drain_order(q) == preview
