"""Leader election's rules on a fake clock, against an in-memory lease store behind the
LeaseApi seam (the real client against the fake API server:
tests/integration/epp/test_leaderelection.py), and its flags."""

from __future__ import annotations

from typing import Any

import pytest

from epp.cli import build_parser
from epp.serving.leaderelection import (
    LeaderElector,
    LeaseRef,
    LeaseTiming,
    Outcome,
    SeenLease,
    options,
)


class MemoryLeases:
    """One lease store with compare-and-swap on a version counter."""

    def __init__(self) -> None:
        self.body: dict[str, Any] | None = None
        self.version = 0

    async def read(self, ref: LeaseRef) -> SeenLease | None:
        if self.body is None:
            return None
        spec = self.body["spec"]
        return SeenLease(
            spec["holderIdentity"],
            str(self.version),
            spec["leaseTransitions"],
            spec.get("acquireTime"),
            spec["renewTime"],
        )

    async def create(self, ref: LeaseRef, body: dict[str, Any]) -> bool:
        if self.body is not None:
            return False
        self.body, self.version = body, self.version + 1
        return True

    async def replace(self, ref: LeaseRef, body: dict[str, Any]) -> bool:
        if body["metadata"].get("resourceVersion") != str(self.version):
            return False
        self.body, self.version = body, self.version + 1
        return True


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


TIMING = LeaseTiming(duration_s=15, renew_deadline_s=10.0, retry_s=2.0)


def elector(store: MemoryLeases, name: str, clock: Clock, changes: list[bool]) -> LeaderElector:
    async def changed(leader: bool) -> None:
        changes.append(leader)

    return LeaderElector(store, LeaseRef("l", "ns", name), TIMING, changed, clock=clock)


async def test_a_held_lease_is_taken_only_after_its_record_stood_still_for_the_duration() -> None:
    store, clock = MemoryLeases(), Clock()
    a_changes: list[bool] = []
    b_changes: list[bool] = []
    a, b = elector(store, "a", clock, a_changes), elector(store, "b", clock, b_changes)
    assert await a.attempt() is Outcome.HELD  # created
    assert await b.attempt() is Outcome.OTHER
    clock.now += 14.9
    assert await b.attempt() is Outcome.OTHER  # a never renewed, yet not expired
    clock.now += 0.1
    await b.step()
    assert b.leader and b_changes == [True]
    assert store.body is not None and store.body["spec"]["leaseTransitions"] == 1
    # a comes back: it finds b's lease and does not lead
    await a.step()
    assert not a.leader and a_changes == []


async def test_a_renewal_restarts_the_others_count() -> None:
    store, clock = MemoryLeases(), Clock()
    a, b = elector(store, "a", clock, []), elector(store, "b", clock, [])
    await a.step()
    await b.step()
    clock.now += 10
    await a.step()  # renewed: a new record
    await b.step()  # b sees it change now
    clock.now += 10
    await b.step()
    assert a.leader and not b.leader


async def test_a_leader_finding_another_holder_steps_down_at_once() -> None:
    store, clock = MemoryLeases(), Clock()
    changes: list[bool] = []
    a = elector(store, "a", clock, changes)
    await a.step()
    assert store.body is not None
    store.body["spec"]["holderIdentity"] = "usurper"  # e.g. after a's lease ran out
    store.version += 1
    await a.step()
    assert not a.leader and changes == [True, False]


async def test_a_stop_releases_the_lease_so_another_takes_it_at_once() -> None:
    store, clock = MemoryLeases(), Clock()
    changes: list[bool] = []
    a, b = elector(store, "a", clock, changes), elector(store, "b", clock, [])
    await a.step()
    await b.step()
    await a.stop()
    assert changes == [True, False]
    assert store.body is not None and store.body["spec"]["holderIdentity"] == ""
    await b.step()  # no waiting for a's lease to run out
    assert b.leader


def test_timing_must_nest() -> None:
    with pytest.raises(ValueError, match="retry-period"):
        LeaseTiming(duration_s=5, renew_deadline_s=5.0, retry_s=1.0).check()
    LeaseTiming().check()


def serve_args(*flags: str) -> Any:
    return build_parser("serve").parse_args(["serve", *flags])


def test_flags() -> None:
    assert options(serve_args()) is None
    assert options(serve_args("--ha-enable-leader-election=false", "--pool-name", "p")) is None
    on = options(serve_args("--ha-enable-leader-election", "--pool-name", "qwen"))
    assert on is not None and on.lease_name == "qwen-epp-leader" and on.timing == LeaseTiming()
    named = options(
        serve_args("--ha-enable-leader-election=true", "--pool-name", "q", "--ha-lease-name", "x")
    )
    assert named is not None and named.lease_name == "x"
    with pytest.raises(ValueError, match="needs --pool-name or --endpoint-selector"):
        options(serve_args("--ha-enable-leader-election"))
    with pytest.raises(ValueError, match="renew-deadline"):
        options(
            serve_args("--ha-enable-leader-election", "--pool-name", "p",
                       "--ha-renew-deadline-seconds", "20")
        )  # fmt: skip
