"""Leader election (``--ha-enable-leader-election``) through the real
``kubernetes-asyncio`` client against the loopback fake API server: electors in this
process, then two real ``epp serve`` replicas of which only the leader is ready."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from epp.discovery.kubernetes import api_client
from epp.serving.leaderelection import (
    KubeLeases,
    LeaderElector,
    LeaseRef,
    LeaseTiming,
    lease_body,
    micro_now,
)
from epp_harness.procs import ManagedProcess, spawn_epp
from tests.support.fake_kube import FakeKube
from tests.support.http import request
from tests.support.kube_objects import pod, pool
from tests.support.kube_server import FakeKubeThread, serving, write_kubeconfig
from tests.support.wait import until, wait_for

FAST = LeaseTiming(duration_s=2, renew_deadline_s=1.0, retry_s=0.1)
LEASE = "qwen-pool-epp-leader"


class Candidates:
    """Electors sharing one lease, each with its own client; who leads, as they say."""

    def __init__(self, fake: FakeKube, kubeconfig: Path) -> None:
        self.fake = fake
        self.kubeconfig = kubeconfig
        self.electors: dict[str, LeaderElector] = {}
        self.changes: list[tuple[str, bool]] = []
        self._leases: list[KubeLeases] = []

    async def add(
        self, name: str, *, start: bool = True, clock: Callable[[], float] = time.monotonic
    ) -> LeaderElector:
        leases = KubeLeases(await api_client(self.kubeconfig), timeout_s=1.0)
        self._leases.append(leases)

        async def changed(leader: bool) -> None:
            self.changes.append((name, leader))

        elector = LeaderElector(
            leases, LeaseRef(LEASE, "default", name), FAST, changed, clock=clock
        )
        self.electors[name] = elector
        if start:
            elector.start()
        return elector

    def leaders(self) -> list[str]:
        return [n for n, e in self.electors.items() if e.leader]

    def holder(self) -> str:
        lease = self.fake.lease("default", LEASE)
        return "" if lease is None else str(lease["spec"]["holderIdentity"])

    async def close(self) -> None:
        for elector in self.electors.values():
            await elector.stop()
        for leases in self._leases:
            await leases.close()


@pytest.fixture
async def candidates(tmp_path: Path) -> AsyncIterator[Candidates]:
    fake = FakeKube()
    async with serving(fake) as url:
        c = Candidates(fake, write_kubeconfig(tmp_path / "kubeconfig", url))
        try:
            yield c
        finally:
            await c.close()


async def test_one_of_two_leads_and_a_clean_stop_hands_over_at_once(
    candidates: Candidates,
) -> None:
    a = await candidates.add("a")
    await until(lambda: a.leader, "a leading alone")
    b = await candidates.add("b", start=False)
    for _ in range(10):  # b keeps trying and keeps finding a's lease renewed
        await b.step()
        await asyncio.sleep(FAST.retry_s)
    assert candidates.leaders() == ["a"] and candidates.holder() == "a"
    before = candidates.fake.lease("default", LEASE)
    assert before is not None and before["spec"]["leaseDurationSeconds"] == 2

    await a.stop()  # releases the lease: b takes it at its next retry ...
    await b.step()  # ... this one, not waiting for the lease to run out
    assert b.leader
    b.start()
    assert candidates.leaders() == ["b"] and candidates.holder() == "b"
    after = candidates.fake.lease("default", LEASE)
    assert after is not None and after["spec"]["leaseTransitions"] == 1
    assert candidates.changes == [("a", True), ("a", False), ("b", True)]


async def test_a_silent_holder_is_replaced_only_once_its_lease_ran_out(
    candidates: Candidates,
) -> None:
    """A holder that died without releasing: its record stops changing, and the lease is
    taken the lease duration (by the contender's clock) after it was first seen."""
    ref = LeaseRef(LEASE, "default", "ghost")
    now = micro_now()
    ghost = lease_body(
        ref, "ghost", 2, acquire_time=now, renew_time=now, transitions=3, version=None
    )
    candidates.fake.apply("leases", ghost)
    began = time.monotonic()
    b = await candidates.add("b")
    await until(lambda: b.leader, "b taking the dead holder's lease", within=10)
    assert time.monotonic() - began >= FAST.duration_s
    lease = candidates.fake.lease("default", LEASE)
    assert lease is not None and lease["spec"]["leaseTransitions"] == 4


async def test_a_leader_that_cannot_renew_steps_down_before_anyone_may_take_over(
    candidates: Candidates,
) -> None:
    a = await candidates.add("a")
    await until(lambda: a.leader, "a leading")
    await a.stop()  # released; from here one elector driven by hand, every retry, ...
    now = [0.0]  # ... on its own clock: what counts is its time, not the machine's
    b = await candidates.add("b", start=False, clock=lambda: now[0])
    await b.step()
    assert b.leader
    candidates.fake.fail_next(*[500] * 1000)  # the API server fails every call
    retries = 0
    while b.leader and retries < 10 * FAST.duration_s / FAST.retry_s:
        retries += 1
        now[0] = retries * FAST.retry_s
        await b.step()
    # stepped down at the first retry past the renew deadline, before the lease (2 s)
    # could run out
    assert FAST.renew_deadline_s <= now[0] < FAST.renew_deadline_s + FAST.retry_s
    assert now[0] < FAST.duration_s
    assert candidates.changes[-2:] == [("b", True), ("b", False)]


# ------------------------------------------------------------------ two `epp serve`


def ready(http_port: int) -> bool:
    return request(f"http://127.0.0.1:{http_port}/ready")[0] == 200


def start_replica(tmp_path: Path, name: str, kubeconfig: Path) -> ManagedProcess:
    return spawn_epp(
        tmp_path, name, "serve", "--grpc-port", "0", "--http-port", "0",
        "--grpc-health-port", "0", "--log-level", "info",
        "--pool-name", "qwen-pool", "--pool-namespace", "default",
        "--kubeconfig", str(kubeconfig), "--ha-enable-leader-election",
        "--ha-lease-duration-seconds", "2", "--ha-renew-deadline-seconds", "1",
        "--ha-retry-period-seconds", "0.2",
    )  # fmt: skip


def test_only_the_leading_replica_is_ready_and_a_standby_takes_over(tmp_path: Path) -> None:
    with FakeKubeThread().running() as kube:
        kube.call(lambda: kube.fake.apply("inferencepools", pool()))
        kube.call(lambda: kube.fake.apply("pods", pod("a", "127.0.0.1")))
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", kube.url)
        procs = [start_replica(tmp_path, f"epp-{i}", kubeconfig) for i in range(2)]
        try:
            ports = {p.name: int(p.wait_ready()["http_port"]) for p in procs}
            readiness: Callable[[], dict[str, bool]] = lambda: {  # noqa: E731
                name: ready(port) for name, port in ports.items()
            }
            wait_for(lambda: sum(readiness().values()) == 1, what="exactly one ready replica")
            for _ in range(5):  # and it stays that way
                assert sum(readiness().values()) == 1
                time.sleep(0.2)
            leader = next(p for p in procs if ready(ports[p.name]))
            standby = next(p for p in procs if p is not leader)
            lease = kube.call(lambda: kube.fake.lease("default", LEASE))
            assert lease is not None and lease["spec"]["holderIdentity"].count("_") >= 1

            os.kill(leader.pid, signal.SIGKILL)  # no release: the lease has to run out
            wait_for(lambda: ready(ports[standby.name]), timeout=60, what="the standby ready")
            # it took the dead leader's lease over (its 2 s ran out), not a fresh one
            taken = kube.call(lambda: kube.fake.lease("default", LEASE))
            assert taken is not None
            assert taken["spec"]["holderIdentity"] != lease["spec"]["holderIdentity"]
            assert taken["spec"]["leaseTransitions"] == lease["spec"]["leaseTransitions"] + 1
        finally:
            for p in procs:
                p.stop()
