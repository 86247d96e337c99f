"""Datastore lifecycle (waiting → healthy → ejected / draining → gone) and failure
ejection with backoff, on a fake clock."""

from __future__ import annotations

import asyncio

import pytest

from epp.admin.instances import status_doc
from epp.config import builtin_registry, instantiate, load
from epp.datalayer.ejection import EjectionPolicy, Ejector, FailureState
from epp.datastore import Datastore, Status
from epp.discovery.runtime import Outcome, RuntimeMembership, WaitPolicy
from epp.lifecycle.observers import EjectionFeedback
from epp.router import StreamOptions
from epp.types import Endpoint, InferenceRequest
from tests.support.routers import make_router
from tests.support.wait import until


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


A, B = Endpoint("10.0.0.1", 1), Endpoint("10.0.0.2", 2)


def active(ds: Datastore) -> list[str]:
    return [s.address for s in ds.snapshot().endpoints]


def test_only_healthy_members_are_pickable() -> None:
    ds = Datastore()
    ds.add(A, waiting=True)
    ds.add(B)
    assert active(ds) == [B.address]
    assert ds.member(A.address).status is Status.WAITING  # type: ignore[union-attr]
    assert ds.add(A)  # ready now
    assert sorted(active(ds)) == sorted([A.address, B.address])
    assert ds.eject(A.address) and active(ds) == [B.address]
    assert ds.add(A) is False  # a resync does not undo an ejection
    assert ds.member(A.address).status is Status.EJECTED  # type: ignore[union-attr]
    assert ds.reinstate(A.address) and A.address in active(ds)


def test_remove_drains_until_the_last_request_ends() -> None:
    ds = Datastore()
    ds.add(A)
    ticket = ds.acquire(A.address)
    version = ds.version
    assert ds.remove(A.address)
    assert ds.member(A.address).status is Status.DRAINING  # type: ignore[union-attr]
    assert active(ds) == [] and ds.version > version
    ticket.release()
    assert ds.member(A.address) is None and len(ds) == 0


def test_draining_member_taken_back_by_add() -> None:
    ds = Datastore()
    ds.add(A)
    ticket = ds.acquire(A.address)
    ds.remove(A.address)
    ds.add(A)
    assert active(ds) == [A.address]
    ticket.release()
    assert ds.member(A.address) is not None  # no longer draining: it stays


def test_drain_deadline_drops_the_member() -> None:
    clock = Clock()
    ds = Datastore(drain_timeout_s=5, clock=clock)
    ds.add(A)
    ticket = ds.acquire(A.address)
    ds.remove(A.address)
    clock.now += 4.9
    assert ds.expire_drains() == []
    clock.now += 0.2
    assert ds.expire_drains() == [A.address] and ds.member(A.address) is None
    ticket.release()  # the late release of a dropped member is harmless
    assert ds.in_flight(A.address) == 0


def test_remove_of_idle_or_waiting_member_is_immediate() -> None:
    ds = Datastore()
    ds.add(A)
    ds.add(B, waiting=True)
    assert ds.remove(A.address) and ds.remove(B.address)
    assert len(ds) == 0 and not ds.remove(A.address)


def test_snapshot_stays_cached_and_cheap_with_many_endpoints() -> None:
    ds = Datastore()
    for i in range(1000):
        ds.add(Endpoint("10.1.0.1", 1000 + i))
    ds.eject("10.1.0.1:1000")
    snap = ds.snapshot()
    assert len(snap.endpoints) == 999 and ds.snapshot() is snap
    assert "10.1.0.1:1000" not in snap.by_address


async def _probe_result(results: dict[str, str | None], address: str) -> str | None:
    return results.get(address)


def ejector(
    policy: EjectionPolicy, probes: dict[str, str | None]
) -> tuple[Ejector, Datastore, Clock]:
    clock = Clock()
    ds = Datastore(clock=clock)
    ds.add(A)
    ds.add(B)
    ej = Ejector(ds, policy, lambda a: _probe_result(probes, a), clock=clock, tick_s=0.001)
    return ej, ds, clock


def test_consecutive_failures_eject_and_a_success_resets_the_count() -> None:
    ej, ds, _ = ejector(EjectionPolicy(eject_after=3), {})
    ej.failure(A.address, "x")
    ej.failure(A.address, "x")
    ej.success(A.address)
    ej.failure(A.address, "x")
    ej.failure(A.address, "x")
    assert ds.member(A.address).status is Status.ACTIVE  # type: ignore[union-attr]
    assert A.address in active(ds)
    ej.failure(A.address, "x")
    assert active(ds) == [B.address]
    assert ej.state(A.address).next_probe_in_s == pytest.approx(1.0)  # first backoff


def test_eject_after_zero_never_ejects() -> None:
    ej, ds, _ = ejector(EjectionPolicy(eject_after=0), {})
    for _ in range(50):
        ej.failure(A.address, "x")
    assert A.address in active(ds)


async def test_backoff_doubles_then_a_passing_probe_reinstates() -> None:
    probes: dict[str, str | None] = {A.address: "cannot connect"}
    ej, ds, clock = ejector(EjectionPolicy(eject_after=1, backoff_s=1, max_backoff_s=3), probes)
    ej.failure(A.address, "x")
    ej.start()
    try:
        backoffs = []
        for _ in range(3):
            wait = ej.state(A.address).next_probe_in_s
            backoffs.append(wait)
            clock.now += wait or 0
            failures = ej.state(A.address).failures
            await until(lambda f=failures: ej.state(A.address).failures > f, "probe to fail")  # type: ignore[misc]
        assert backoffs == [1.0, 2.0, 3.0]  # doubling, capped
        probes[A.address] = None
        clock.now += 3
        await until(lambda: A.address in active(ds), "reinstatement")
        assert ej.state(A.address) == FailureState()
    finally:
        await ej.stop()


@pytest.mark.parametrize("keep", [False, True])
async def test_removed_after_failing_for_remove_after_unless_kept(keep: bool) -> None:
    probes: dict[str, str | None] = {A.address: "down"}
    policy = EjectionPolicy(eject_after=2, backoff_s=1, remove_after_s=2.5, keep_ejected=keep)
    ej, ds, clock = ejector(policy, probes)
    ej.failure(A.address, "x")
    ej.failure(A.address, "x")
    ej.start()
    try:
        clock.now += 1
        if keep:
            await until(lambda: ej.state(A.address).failures >= 3, "third failure")
            clock.now += 2
            await until(lambda: ej.state(A.address).failures >= 4, "fourth failure")
            assert ds.member(A.address).status is Status.EJECTED  # type: ignore[union-attr]
        else:
            await until(lambda: ej.state(A.address).failures >= 3, "third failure")
            assert ej.state(A.address).removal_in_s == pytest.approx(1.5)
            clock.now += 1.5  # the next probe is due at the deadline, not 2 s later
            await until(lambda: ds.member(A.address) is None, "removal")
    finally:
        await ej.stop()


def test_a_slow_scrape_is_no_failure_while_the_server_answers() -> None:
    ej, ds, clock = ejector(EjectionPolicy(eject_after=3, slow_grace_s=30), {})
    ej.success(A.address)  # e.g. a response below 500
    for _ in range(10):
        clock.now += 2
        ej.failure(A.address, "scrape: no answer within 5s", slow=True)
    assert A.address in active(ds)
    clock.now += 30  # nothing good heard for 30 s: timeouts count again
    for _ in range(3):
        ej.failure(A.address, "scrape: no answer within 5s", slow=True)
    assert A.address not in active(ds)


async def test_default_removal_outlasts_a_model_server_restart() -> None:
    """A server down for minutes (a vLLM restart) stays a member, re-checked with
    capped backoff, and /status says when it would be removed."""
    probes: dict[str, str | None] = {A.address: "connection refused"}
    ej, ds, clock = ejector(EjectionPolicy(), probes)
    for _ in range(EjectionPolicy.eject_after):
        ej.failure(A.address, "connect failure")
    ej.start()
    try:
        while clock.now < 100 + 300:  # five minutes of failed probes
            wait = ej.state(A.address).next_probe_in_s
            assert wait is not None and wait <= EjectionPolicy.max_backoff_s
            failures = ej.state(A.address).failures
            clock.now += wait
            await until(lambda f=failures: ej.state(A.address).failures > f, "a failed probe")  # type: ignore[misc]
        member = ds.member(A.address)
        assert member is not None and member.status is Status.EJECTED
        doc = status_doc(ds, ej.state)["endpoints"][0]
        assert doc["state"] == "ejected"
        assert doc["removal_in_s"] == pytest.approx(100 + 600 - clock.now, abs=1e-3)
        probes[A.address] = None  # back up: the next probe reinstates it
        clock.now += ej.state(A.address).next_probe_in_s or 0
        await until(lambda: A.address in active(ds), "reinstated")
        assert "removal_in_s" not in status_doc(ds, ej.state)["endpoints"][0]
    finally:
        await ej.stop()


async def test_a_removed_runtime_member_rejoins_when_added_again() -> None:
    ds = Datastore()
    answers: dict[str, str | None] = {A.address: None}
    membership = RuntimeMembership(ds, lambda a: _probe_result(answers, a), WaitPolicy(0.01, 3))
    assert await membership.add(A) is Outcome.ADDED
    ds.remove(A.address)  # what removal by failure ejection does
    assert ds.member(A.address) is None
    assert await membership.add(A) is Outcome.ADDED
    assert A.address in active(ds)


async def test_ejection_loop_expires_drains() -> None:
    ej, ds, clock = ejector(EjectionPolicy(), {})
    ds.drain_timeout_s = 1
    ds.acquire(A.address)
    ds.remove(A.address)
    ej.start()
    try:
        await asyncio.sleep(0)
        assert ds.member(A.address) is not None
        clock.now += 2
        await until(lambda: ds.member(A.address) is None, "drain deadline")
    finally:
        await ej.stop()


class Outcomes:
    """Records what the router reports (a fake of the EndpointOutcomes protocol)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def failure(self, address: str, reason: str, slow: bool = False, serving: bool = False) -> None:
        self.events.append(("failure", address))

    def success(self, address: str) -> None:
        self.events.append(("success", address))


def test_router_counts_a_failover_against_the_primary_and_caps_the_list() -> None:
    now = [100.0]
    ds = Datastore(clock=lambda: now[0])
    for port in (1, 2, 3, 4):
        ds.add(Endpoint("10.0.0.1", port))
    outcomes = Outcomes()
    router = make_router(
        ds,
        instantiate(load(None), builtin_registry()),
        stream=StreamOptions(1000),
        clock=lambda: now[0],
        observers=[EjectionFeedback(outcomes, ds, lambda: now[0])],
    )
    # just added: Envoy may not know it yet, so a failover away from it is no failure
    router.response_seen("10.0.0.1:1", 200, "10.0.0.1:2")
    assert outcomes.events == [("success", "10.0.0.1:2")]
    outcomes.events.clear()
    now[0] += 1.5
    request = InferenceRequest(request_id="r", model="m", path="/v1/completions")
    assert len(router.route(request).result.targets) == 1  # no signal: one address
    assert len(router.route(request, max_destinations=3).result.targets) == 3
    router.response_seen("10.0.0.1:1", 200, "10.0.0.1:2")
    router.response_seen("10.0.0.1:3", 503, "10.0.0.1:3")
    router.response_seen("10.0.0.1:4", 200)
    assert outcomes.events == [
        ("failure", "10.0.0.1:1"),
        ("success", "10.0.0.1:2"),
        ("failure", "10.0.0.1:3"),
        ("success", "10.0.0.1:4"),
    ]


class GatedCheck:
    """A readiness check the test answers by hand (a fake of the Check seam)."""

    def __init__(self) -> None:
        self.gates: list[asyncio.Future[str | None]] = []

    async def __call__(self, address: str) -> str | None:
        gate: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        self.gates.append(gate)
        return await gate


async def test_remove_during_the_readiness_check_is_not_undone() -> None:
    ds, check = Datastore(), GatedCheck()
    membership = RuntimeMembership(ds, check, WaitPolicy(retry_interval_s=0.01, max_retries=3))
    endpoint = Endpoint("10.0.0.7", 8000)
    adding = asyncio.ensure_future(membership.add(endpoint))
    await until(lambda: len(check.gates) == 1, "the first check")
    ds.add(endpoint, waiting=True)  # what the admin API's status shows meanwhile
    membership.remove(endpoint.address)
    check.gates[0].set_result(None)  # the server answers after all
    assert await adding is Outcome.WITHDRAWN
    member = ds.member(endpoint.address)
    assert member is None or member.status is not Status.ACTIVE
    await membership.stop()


async def test_remove_then_add_again_leaves_one_waiter() -> None:
    ds, check = Datastore(), GatedCheck()
    membership = RuntimeMembership(ds, check, WaitPolicy(retry_interval_s=0.01, max_retries=50))
    endpoint = Endpoint("10.0.0.8", 8000)
    first = asyncio.ensure_future(membership.add(endpoint))
    await until(lambda: len(check.gates) == 1, "the first check")
    check.gates[0].set_result("not up")
    assert await first is Outcome.WAITING
    membership.remove(endpoint.address)
    second = asyncio.ensure_future(membership.add(endpoint))
    await until(lambda: len(check.gates) >= 2, "the re-add's check")
    check.gates[-1].set_result("still not up")
    assert await second is Outcome.WAITING
    assert len(membership._waiters) == 1
    await until(lambda: len(check.gates) >= 3, "the new waiter's check")
    check.gates[-1].set_result(None)
    await until(lambda: ds.member(endpoint.address).status is Status.ACTIVE, "joins")  # type: ignore[union-attr]
    await membership.stop()


def test_waiting_re_add_of_a_draining_member_waits_instead_of_serving() -> None:
    ds = Datastore()
    endpoint = Endpoint("10.0.0.9", 8000)
    ds.add(endpoint)
    ticket = ds.acquire(endpoint.address)
    ds.remove(endpoint.address)  # in flight: draining
    assert ds.member(endpoint.address).status is Status.DRAINING  # type: ignore[union-attr]
    ds.add(endpoint, waiting=True)  # re-added, but its server is down
    assert ds.member(endpoint.address).status is Status.WAITING  # type: ignore[union-attr]
    assert endpoint.address not in {s.address for s in ds.snapshot().endpoints}
    ticket.release()


def test_a_late_release_after_a_drain_deadline_does_not_touch_a_re_added_member() -> None:
    now = [0.0]
    ds = Datastore(drain_timeout_s=5, clock=lambda: now[0])
    endpoint = Endpoint("10.0.0.5", 8000)
    ds.add(endpoint)
    stale = ds.acquire(endpoint.address)  # a request that outlives the drain deadline
    ds.remove(endpoint.address)
    now[0] = 10.0
    assert ds.expire_drains() == [endpoint.address]
    ds.add(endpoint)  # back, with a request of its own
    fresh = ds.acquire(endpoint.address)
    ds.remove(endpoint.address)  # draining again, waiting for `fresh`
    stale.release()  # must not count as `fresh` finishing
    member = ds.member(endpoint.address)
    assert member is not None and member.status is Status.DRAINING
    assert ds.in_flight(endpoint.address) == 1
    fresh.release()
    assert ds.member(endpoint.address) is None and ds.in_flight(endpoint.address) == 0


def test_a_working_scrape_does_not_excuse_5xx_answers() -> None:
    """A server that answers /metrics but fails every request is still ejected; one
    that could not be reached and now scrapes fine starts over."""
    ej, ds, _ = ejector(EjectionPolicy(eject_after=3), {})
    for _ in range(3):
        ej.failure(A.address, "HTTP 500 on the response path", serving=True)
        ej.success(A.address, serving=False)  # its /metrics answers in between
    assert active(ds) == [B.address]
    ej2, ds2, _ = ejector(EjectionPolicy(eject_after=3), {})
    for _ in range(3):
        ej2.failure(A.address, "connect failure")
        ej2.success(A.address, serving=False)
    assert A.address in active(ds2)
