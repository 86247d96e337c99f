"""InferencePool discovery through the real kubernetes-asyncio client against a loopback
fake API server (tests/support/fake_kube.py): membership, annotations, watch robustness."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from epp.datastore import Datastore
from epp.discovery.kubernetes import PoolDiscovery, api_client, start_discovery
from epp.discovery.poolref import PoolRef
from epp.discovery.reflector import WatchTiming
from epp.flowcontrol.saturation import WatchedObjectives
from epp.types import Endpoint, Role
from tests.support.fake_kube import FakeKube
from tests.support.kube_objects import pod, pool
from tests.support.kube_server import serving, write_kubeconfig
from tests.support.wait import until

FAST = WatchTiming(watch_timeout_s=60, backoff_initial_s=0.01, backoff_max_s=0.05)
PORT_DISCOVERY = "inference.networking.x-k8s.io/port-discovery"


@dataclass
class World:
    fake: FakeKube
    datastore: Datastore
    discovery: PoolDiscovery
    synced_calls: list[bool]  # every readiness change, in order

    def addresses(self) -> set[str]:
        return {s.address for s in self.datastore.snapshot().endpoints}

    async def settle(self, expected: set[str], what: str = "endpoints") -> None:
        await until(lambda: self.addresses() == expected, f"{what} == {sorted(expected)}")


async def start(fake: FakeKube, url: str, tmp_path: Path, timing: WatchTiming = FAST) -> World:
    datastore = Datastore()
    calls: list[bool] = []

    async def on_ready(ready: bool) -> None:
        calls.append(ready)

    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", url)
    discovery = await start_discovery(
        PoolRef("qwen-pool", "default", kubeconfig), datastore, "vllm", on_ready, timing
    )
    return World(fake, datastore, discovery, calls)


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    """A pool selecting app=qwen on ports 8000 and 8001, one ready pod, discovery synced."""
    fake = FakeKube()
    fake.apply("inferencepools", pool(target_ports=[8000, 8001]))
    fake.apply("pods", pod("a", "10.0.0.1"))
    async with serving(fake) as url:
        w = await start(fake, url, tmp_path)
        try:
            await until(w.discovery.synced.is_set, "first sync")
            yield w
        finally:
            await w.discovery.stop()


async def test_first_sync_registers_ready_pods_times_target_ports(world: World) -> None:
    assert world.addresses() == {"10.0.0.1:8000", "10.0.0.1:8001"}
    assert world.synced_calls == [True]
    # the client asked the server to filter: pods by the pool's labels, the pool by name
    (pod_list, *_) = world.fake.seen("pods")
    assert pod_list.query["labelSelector"] == "app=qwen"
    assert world.fake.seen("inferencepools")[0].query["fieldSelector"] == (
        "metadata.name=qwen-pool"
    )


async def test_pod_added_unready_ready_deleted(world: World) -> None:
    fake, both = world.fake, {"10.0.0.1:8000", "10.0.0.1:8001"}
    fake.apply("pods", pod("b", "10.0.0.2", ready=False))
    fake.apply("pods", pod("c", "10.0.0.3", labels={"app": "other"}))
    fake.apply("pods", pod("b", "10.0.0.2"))
    await world.settle(both | {"10.0.0.2:8000", "10.0.0.2:8001"}, "pod b ready")
    fake.apply("pods", pod("a", "10.0.0.1", ready=False))
    await world.settle({"10.0.0.2:8000", "10.0.0.2:8001"}, "pod a unready")
    fake.delete("pods", "default", "b")
    fake.apply("pods", pod("a", "10.0.0.1"))
    await world.settle(both, "pod b deleted, a ready again")
    # the pod that never matched the selector was never sent to the client
    assert world.datastore.get("10.0.0.3:8000") is None


async def test_a_pod_of_unexpected_shape_is_left_out_and_the_rest_served(world: World) -> None:
    odd = pod("odd", "10.0.0.9")
    odd["status"]["conditions"] = "Ready"  # not a list: no API server sends this
    world.fake.apply("pods", odd)
    world.fake.apply("pods", pod("b", "10.0.0.2"))
    await world.settle({"10.0.0.1:8000", "10.0.0.1:8001", "10.0.0.2:8000", "10.0.0.2:8001"})
    await until(lambda: world.fake.events, "an Event about the odd pod")
    assert world.fake.events[0]["message"].startswith("pod default/odd: unreadable")


async def test_pod_relabelled_out_of_the_selector_leaves(world: World) -> None:
    world.fake.apply("pods", pod("a", "10.0.0.1", labels={"app": "moved"}))
    await world.settle(set(), "pod a relabelled")


def declare(fake: FakeKube, *ports: tuple[object, dict[str, str]]) -> None:
    """Pod a at 10.0.0.1 declaring ``(number, attributes)`` entries for qwen-pool."""
    entries = [{"inferencePool": "qwen-pool", "number": n, "attributes": a} for n, a in ports]
    fake.apply("pods", pod("a", "10.0.0.1", port_discovery=entries))


def role(world: World, address: str) -> Role | None:
    state = world.datastore.get(address)
    return None if state is None else state.endpoint.role


async def test_annotations_added_edited_and_malformed(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    fake = world.fake
    declare(fake, (8007, {"role": "prefill"}), (8008, {}))
    await world.settle({"10.0.0.1:8007", "10.0.0.1:8008"}, "port discovery added")
    assert role(world, "10.0.0.1:8007") is Role.PREFILL
    declare(fake, (8007, {"role": "decode"}), (9009, {}))
    await world.settle({"10.0.0.1:8007", "10.0.0.1:9009"}, "port discovery edited")
    assert role(world, "10.0.0.1:8007") is Role.DECODE
    with caplog.at_level(logging.WARNING, logger="epp.discovery.kubernetes"):
        declare(fake, (8007, {}), ("nine", {}))
        await world.settle({"10.0.0.1:8007"}, "malformed entry dropped, the other kept")
    problem = f"pod default/a: annotation {PORT_DISCOVERY}[1].number 'nine' is not a port"
    assert any(r.getMessage().startswith(problem) for r in caplog.records)
    # ...and the same text as a Warning Event on the pod
    await until(lambda: fake.events, "an Event")
    (event,) = fake.events
    assert event["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": "a",
        "namespace": "default",
        "uid": "uid-a",
    }
    assert event["type"] == "Warning" and event["message"].startswith(problem)
    # a second update carrying the same problem is not reported again
    fake.apply("pods", {**fake.objects[("pods", "default", "a")], "spec": {"x": 1}})
    fake.apply("pods", pod("b", "10.0.0.2"))
    await world.settle({"10.0.0.1:8007", "10.0.0.2:8000", "10.0.0.2:8001"})
    assert len(fake.events) == 1


async def test_active_ports_and_target_port_changes(world: World) -> None:
    fake = world.fake
    active = {"inference.networking.k8s.io/active-ports": "8001"}
    fake.apply("pods", pod("a", "10.0.0.1", annotations=active))
    await world.settle({"10.0.0.1:8001"}, "active-ports limits")
    fake.apply("inferencepools", pool(target_ports=[8001, 8002]))
    fake.apply("pods", pod("a", "10.0.0.1"))
    await world.settle({"10.0.0.1:8001", "10.0.0.1:8002"}, "targetPorts changed")


async def test_selector_change_recomputes_membership(world: World) -> None:
    fake = world.fake
    fake.apply("pods", pod("g", "10.0.0.7", labels={"app": "gemma"}))
    fake.apply("inferencepools", pool(match_labels={"app": "gemma"}, target_ports=[8000]))
    await world.settle({"10.0.0.7:8000"}, "selector switched to app=gemma")
    last_list = [r for r in fake.seen("pods") if not r.watch][-1]
    assert last_list.query["labelSelector"] == "app=gemma"
    fake.apply("pods", pod("h", "10.0.0.8", labels={"app": "gemma"}))
    await world.settle({"10.0.0.7:8000", "10.0.0.8:8000"}, "new selector's watch is live")


async def test_pool_deleted_drains_only_discovered_endpoints_and_returns(world: World) -> None:
    world.datastore.add(Endpoint("192.168.0.9", 9000))  # a static --endpoint
    world.fake.delete("inferencepools", "default", "qwen-pool")
    await world.settle({"192.168.0.9:9000"}, "pool deleted")
    await until(lambda: world.synced_calls == [True, False], "not ready without the pool")
    world.fake.apply("inferencepools", pool(target_ports=[8000]))
    await world.settle({"192.168.0.9:9000", "10.0.0.1:8000"}, "pool recreated")
    await until(lambda: world.synced_calls == [True, False, True], "ready again")


async def test_dropped_watch_resumes_from_last_version_without_listing(world: World) -> None:
    fake = world.fake
    await until(lambda: fake.open_watches("pods") == 1, "pod watch open")
    fake.apply("pods", pod("b", "10.0.0.2"))
    await world.settle({"10.0.0.1:8000", "10.0.0.1:8001", "10.0.0.2:8000", "10.0.0.2:8001"})
    last_seen = fake.objects[("pods", "default", "b")]["metadata"]["resourceVersion"]
    lists_before = [r for r in fake.seen("pods") if not r.watch]
    assert fake.drop_watches() == 2
    fake.delete("pods", "default", "a")  # happens while no watch is open
    await world.settle({"10.0.0.2:8000", "10.0.0.2:8001"}, "change made while dropped")
    assert [r for r in fake.seen("pods") if not r.watch] == lists_before
    resumed = [r for r in fake.seen("pods") if r.watch][-1]
    assert resumed.query["resourceVersion"] == last_seen


async def test_bookmark_moves_the_resume_point(world: World) -> None:
    fake = world.fake
    await until(lambda: fake.open_watches("pods") == 1, "pod watch open")
    fake.apply("pods", pod("other", labels={"app": "x"}))  # invisible to our watch
    fake.bookmark()
    await until(lambda: fake.open_watches("pods") == 1, "still watching")
    fake.compact()  # history before the bookmark is gone: resuming from it must still work
    bookmark_rv = str(fake.rv)
    fake.drop_watches()
    await until(lambda: len([r for r in fake.seen("pods") if r.watch]) >= 2, "watch re-opened")
    resumed = [r for r in fake.seen("pods") if r.watch][1]
    assert resumed.query["resourceVersion"] == bookmark_rv
    assert len([r for r in fake.seen("pods") if not r.watch]) == 1  # no relist


async def test_410_gone_relists_and_catches_up(world: World) -> None:
    fake = world.fake
    await until(lambda: fake.open_watches("pods") == 1, "pod watch open")
    lists_before = len([r for r in fake.seen("pods") if not r.watch])
    fake.drop_watches()
    fake.apply("pods", pod("b", "10.0.0.2"))
    fake.delete("pods", "default", "a")
    fake.compact()  # the client's version is now too old: its watch gets ERROR 410
    await world.settle({"10.0.0.2:8000", "10.0.0.2:8001"}, "state after relist")
    assert len([r for r in fake.seen("pods") if not r.watch]) == lists_before + 1


async def test_api_errors_back_off_then_sync(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fake = FakeKube()
    fake.apply("inferencepools", pool(target_ports=[8000]))
    fake.apply("pods", pod("a", "10.0.0.1"))
    fake.fail_next(500, 503, 403)
    async with serving(fake) as url:
        with caplog.at_level(logging.WARNING, logger="epp.discovery.reflector"):
            w = await start(fake, url, tmp_path)
            try:
                await until(w.discovery.synced.is_set, "sync after errors")
                assert w.addresses() == {"10.0.0.1:8000"}
            finally:
                await w.discovery.stop()
    retries = [r.getMessage() for r in caplog.records if "listing again in" in r.getMessage()]
    assert len(retries) == 3
    assert "API error 500 InternalError: injected failure 500" in retries[0]
    assert "API error 403" in retries[2] and "RBAC" in retries[2]


async def test_missing_pool_is_not_synced_until_created(tmp_path: Path) -> None:
    fake = FakeKube()
    fake.apply("pods", pod("a", "10.0.0.1"))
    async with serving(fake) as url:
        w = await start(fake, url, tmp_path)
        try:
            await until(lambda: fake.open_watches("inferencepools") == 1, "pool watch open")
            assert not w.discovery.synced.is_set() and w.addresses() == set()
            fake.apply("inferencepools", pool(target_ports=[8000]))
            await until(w.discovery.synced.is_set, "sync once the pool exists")
            await w.settle({"10.0.0.1:8000"})
            assert w.synced_calls == [True]
        finally:
            await w.discovery.stop()


async def test_server_side_watch_timeout_resumes(tmp_path: Path) -> None:
    fake = FakeKube()
    fake.apply("inferencepools", pool(target_ports=[8000]))
    async with serving(fake) as url:
        timing = WatchTiming(watch_timeout_s=1, backoff_initial_s=0.01, backoff_max_s=0.05)
        w = await start(fake, url, tmp_path, timing)
        try:
            await until(
                lambda: len([r for r in fake.seen("pods") if r.watch]) >= 2, "second pod watch"
            )
            fake.apply("pods", pod("a", "10.0.0.1"))
            await w.settle({"10.0.0.1:8000"})
            assert len([r for r in fake.seen("pods") if not r.watch]) == 1
        finally:
            await w.discovery.stop()


async def test_unreadable_kubeconfig_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(OSError, match=r"Kubernetes client config \(.*nope"):
        await api_client(tmp_path / "nope")


async def test_hung_list_times_out_and_is_retried(tmp_path: Path) -> None:
    fake = FakeKube()
    fake.apply("inferencepools", pool(target_ports=[8000]))
    fake.apply("pods", pod("a", "10.0.0.1"))
    fake.stall_next()
    async with serving(fake) as url:
        timing = WatchTiming(list_timeout_s=0.3, backoff_initial_s=0.01, backoff_max_s=0.05)
        w = await start(fake, url, tmp_path, timing)
        try:
            await until(w.discovery.synced.is_set, "sync after the hung list")
            assert w.addresses() == {"10.0.0.1:8000"}
            assert len([r for r in fake.seen("inferencepools") if not r.watch]) == 2
        finally:
            await w.discovery.stop()


async def test_watches_ending_at_once_are_not_retried_in_a_tight_loop(tmp_path: Path) -> None:
    fake = FakeKube()
    fake.apply("inferencepools", pool(target_ports=[8000]))
    fake.apply("pods", pod("a", "10.0.0.1"))
    fake.end_watches_at_once = True
    async with serving(fake) as url:
        timing = WatchTiming(backoff_initial_s=0.4, backoff_max_s=0.4)
        w = await start(fake, url, tmp_path, timing)
        try:
            await until(w.discovery.synced.is_set, "first sync")
            loop = asyncio.get_running_loop()
            times: list[float] = []
            while len(times) < 2:
                n = len([r for r in fake.seen("pods") if r.watch])
                await until(
                    lambda n=n: len([r for r in fake.seen("pods") if r.watch]) > n, "next watch"
                )
                times.append(loop.time())
            # each early end waits at least half the backoff step before watching again
            assert times[1] - times[0] >= 0.2
            fake.apply("pods", pod("b", "10.0.0.2"))  # replayed by the next watch
            await w.settle({"10.0.0.1:8000", "10.0.0.2:8000"})
        finally:
            await w.discovery.stop()


async def test_inference_objectives_of_the_pool_give_priorities(tmp_path: Path) -> None:
    """The pool's InferenceObjectives, watched: added, changed, deleted, malformed, and
    selected by the pool's labels; the scheduler reads them beside the config's."""
    from epp.config import build_scheduler
    from epp.types import InferenceRequest
    from tests.support.kube_objects import objective

    fake = FakeKube()
    fake.apply("inferencepools", pool(labels={"tier": "gold"}))
    fake.apply("pods", pod("a", "10.0.0.1"))
    fake.apply("inferenceobjectives", objective("critical", 10))
    fake.apply("inferenceobjectives", objective("batch", -5))
    fake.apply("inferenceobjectives", objective("elsewhere", 7, pool_ref="other-pool"))
    gold = {"matchLabels": {"tier": "gold"}}
    fake.apply("inferenceobjectives", objective("gold", 3, pool_ref=None, poolSelector=gold))
    fake.apply("inferenceobjectives", objective("plain"))
    priorities = WatchedObjectives()

    async def on_ready(ready: bool) -> None:
        pass

    async with serving(fake) as url:
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", url)
        discovery = await start_discovery(
            PoolRef("qwen-pool", "default", kubeconfig), Datastore(), "vllm", on_ready, FAST,
            objectives=priorities,
        )  # fmt: skip
        try:
            expected = {"critical": 10, "batch": -5, "gold": 3, "plain": 0}
            await until(lambda: priorities == expected, "the first list")
            scheduler = build_scheduler("admission: {objectives: {batch: -1}}")
            scheduler.objectives = priorities

            def band(name: str) -> int:
                headers = {"x-gateway-inference-objective": name}
                return scheduler.priority(InferenceRequest("r", "m", "/", headers=headers))

            assert (band("critical"), band("batch"), band("elsewhere")) == (10, -1, 0)
            fake.apply("inferenceobjectives", objective("critical", 20))
            fake.delete("inferenceobjectives", "default", "plain")
            fake.apply("inferenceobjectives", objective("bad", pool_ref=None, priority="high"))
            await until(
                lambda: priorities == {"critical": 20, "batch": -5, "gold": 3}, "watch events"
            )
            assert band("critical") == 20
            # the pool is relabelled: the selector no longer matches it
            fake.apply("inferencepools", pool(labels={"tier": "silver"}))
            await until(lambda: "gold" not in priorities, "the pool's labels followed")
            assert fake.seen("inferenceobjectives")[0].query.get("fieldSelector") is None
        finally:
            await discovery.stop()
