"""What the EPP learns of the adapters each server holds, against real ``epp sim``
processes (``GET /v1/models`` as vLLM answers it): a server is listed as it joins,
listed again every ``listIntervalSeconds`` (an adapter loaded or unloaded behind the
EPP's back is seen), forgotten as it leaves; an answer that casts doubt takes the adapter
off at once and lists the server again, which puts it back only if it is still there; so
does a restart, seen in the first scrape of the new process.

AdapterPlacement runs in the test's event loop; the tests wait with :func:`until`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import orjson
import pytest

from epp.datalayer.engines import engine_names
from epp.datalayer.prometheus import parse_metrics
from epp.datastore import Datastore
from epp.lora.placement import AdapterPlacement, PlacementConfig
from epp.observability.metrics import EppMetrics
from epp.types import Endpoint
from tests.support.http import request
from tests.support.sim import SimProc, sims
from tests.support.wait import until


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[SimProc]]:
    """sim-0 starts with adapter a1 (``--lora-modules``), sim-1 with none."""
    with sims(
        tmp_path_factory.mktemp("listing"),
        ["--max-loras", "2", "--lora-modules", "a1=/adapters/a1"],
        ["--enable-lora", "--max-loras", "2"],
    ) as procs:
        yield procs


def endpoint(sim: SimProc) -> Endpoint:
    return Endpoint("127.0.0.1", sim.port)


async def post(sim: SimProc, path: str, adapter: str) -> None:
    """Load or unload ``adapter`` on ``sim`` through its own API (behind the EPP's back)."""
    doc = orjson.dumps({"lora_name": adapter, "lora_path": f"/adapters/{adapter}"})
    status, _, body = await asyncio.to_thread(request, f"{sim.url}{path}", doc)
    assert status == 200, body


def placement_for(ds: Datastore, interval_s: float) -> AdapterPlacement:
    return AdapterPlacement(PlacementConfig(list_interval_s=interval_s), dict, ds, EppMetrics(ds))


@pytest.fixture
async def listing(servers: list[SimProc]) -> AsyncIterator[tuple[Datastore, AdapterPlacement]]:
    """A placement that lists every 50 ms, started on an empty pool."""
    ds = Datastore()
    placement = placement_for(ds, 0.05)
    placement.start()
    try:
        yield ds, placement
    finally:
        await placement.stop()


async def test_servers_are_listed_as_they_join_and_forgotten_as_they_leave(
    servers: list[SimProc], listing: tuple[Datastore, AdapterPlacement]
) -> None:
    ds, placement = listing
    s0, s1 = (endpoint(s).address for s in servers)
    assert placement.listing() == {}
    ds.add(endpoint(servers[0]))
    await until(lambda: placement.holders("a1") == {s0}, "sim-0 listed with a1")
    assert placement.lists("a1") and not placement.lists("sim-model")
    ds.add(endpoint(servers[1]))
    await until(lambda: s1 in placement.listing(), "sim-1 listed")
    assert placement.listing() == {s0: ["a1"], s1: []}
    ds.remove(s1)
    assert placement.listing() == {s0: ["a1"]}


async def test_adapters_loaded_or_unloaded_behind_its_back_are_seen(
    servers: list[SimProc], listing: tuple[Datastore, AdapterPlacement]
) -> None:
    ds, placement = listing
    sim1 = servers[1]
    s1 = endpoint(sim1).address
    ds.add(endpoint(sim1))
    await until(lambda: s1 in placement.listing(), "sim-1 listed")
    await post(sim1, "/v1/load_lora_adapter", "a2")
    try:
        await until(lambda: placement.holders("a2") == {s1}, "a2 seen on sim-1")
    finally:
        await post(sim1, "/v1/unload_lora_adapter", "a2")
    await until(lambda: not placement.lists("a2"), "a2 seen gone")
    assert placement.holders("a2") == frozenset()


async def test_a_doubt_takes_the_adapter_off_and_a_listing_puts_it_back_if_still_there(
    servers: list[SimProc],
) -> None:
    ds = Datastore()
    placement = placement_for(ds, 0)  # listed as it joins, and after a doubt: no more
    placement.start()
    sim0 = servers[0]
    s0 = endpoint(sim0).address
    try:
        ds.add(endpoint(sim0))
        await until(lambda: placement.holders("a1") == {s0}, "sim-0 listed with a1")
        placement.answered("a1", s0, 404, s0)  # a false alarm: sim-0 still has a1
        assert placement.holders("a1") == frozenset()  # off at once ...
        await until(lambda: placement.holders("a1") == {s0}, "a1 back on sim-0")  # ... and back
        await post(sim0, "/v1/unload_lora_adapter", "a1")  # sim-0 really loses it
        try:
            assert placement.holders("a1") == {s0}  # unseen: no periodic listing here
            placement.answered("a1", s0, 404, s0)
            assert placement.holders("a1") == frozenset()
            ds.add(endpoint(servers[1]))
            await until(lambda: len(placement.listing()) == 2, "sim-1 listed")
            assert not placement.lists("a1")  # sim-0's listing cannot bring it back
        finally:
            await post(sim0, "/v1/load_lora_adapter", "a1")
    finally:
        await placement.stop()


def restart(sim: SimProc) -> None:
    """SIGKILL ``sim`` and start it again on its port: a new process, without the
    adapters loaded into the old one."""
    proc, port = sim.proc, sim.port
    assert proc.proc is not None and proc.ready_file is not None
    proc.proc.kill()
    proc.proc.wait()
    proc.ready_file.unlink()
    argv = list(proc.argv)
    argv[argv.index("--port") + 1] = str(port)
    proc.restart(argv).wait_ready()


async def test_a_restarted_server_loses_its_adapters_at_its_first_scrape(tmp_path: Path) -> None:
    """A server killed and started again on its port has unloaded every adapter loaded at
    runtime. The first scrape of the new process (a new ``process_start_time_seconds``)
    takes them off it at once and lists it again: no periodic listing, ejection or 404
    needed (a server restarted faster than it is ejected would otherwise keep them in
    the EPP's view until one of those, and answer 404 for them meanwhile)."""
    ds = Datastore()
    catalogue = {"a2": "/adapters/a2"}
    placement = AdapterPlacement(
        PlacementConfig(list_interval_s=0), lambda: catalogue, ds, EppMetrics(ds)
    )
    vllm = engine_names("vllm")
    with sims(tmp_path, ["--enable-lora", "--max-loras", "2"]) as (sim,):
        address = endpoint(sim).address

        async def scrape() -> None:  # what the scraper does, once
            _, _, body = await asyncio.to_thread(request, f"{sim.url}/metrics")
            ds.update_metrics(address, parse_metrics(body.decode(), vllm, time.monotonic()))

        placement.start()
        try:
            ds.add(endpoint(sim))
            await until(lambda: address in placement.listing(), "the server listed")
            await scrape()
            await placement.load("a2", address)
            await scrape()  # the same process again: nothing changes
            assert placement.holders("a2") == {address}
            await asyncio.to_thread(restart, sim)
            await scrape()
            assert placement.holders("a2") == frozenset()  # off at once ...
            # ... and listed again: it holds nothing
            await until(lambda: placement.listing().get(address) == [], "listed again")
        finally:
            await placement.stop()
