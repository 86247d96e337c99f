"""Failure accounting against real servers: any success the EPP sees from a server (a
scrape, a prefill leg) resets its consecutive failures, and a prefill leg counts once.

The scraper and coordinator run in the test's event loop against a real ``epp sim`` or
a small aiohttp server (for an answer a simulator does not give); the tests wait on
conditions, never on fixed sleeps."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Iterator

import pytest
from aiohttp import web

from epp.datalayer.ejection import EjectionPolicy, Ejector
from epp.datalayer.scraper import MetricsScraper
from epp.datastore import Datastore, Status
from epp.disagg.coordinators import CoordinatorEnv, Handoff, NixlCoordinator
from epp.disagg.legs import AiohttpLegTransport, LegClient
from epp.observability.metrics import EppMetrics
from epp.types import Endpoint, InferenceRequest, Role
from tests.support.sim import SimProc, sims
from tests.support.wait import until


@pytest.fixture(scope="module")
def prefill(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimProc]:
    with sims(tmp_path_factory.mktemp("sims"), ["--role", "prefill", "--time-scale", "0"]) as s:
        yield s[0]


async def _never_called(_address: str) -> str | None:
    raise AssertionError("no probe expected")


def _pool(port: int) -> tuple[Datastore, Ejector, Endpoint]:
    ds = Datastore()
    endpoint = Endpoint("127.0.0.1", port, Role.PREFILL)
    ds.add(endpoint)
    return ds, Ejector(ds, EjectionPolicy(eject_after=3), _never_called), endpoint


async def test_a_scrape_that_works_resets_the_failure_count(prefill: SimProc) -> None:
    ds, ejector, endpoint = _pool(prefill.port)
    ejector.failure(endpoint.address, "HTTP 503 on the response path")
    ejector.failure(endpoint.address, "HTTP 503 on the response path")
    assert ejector.state(endpoint.address).failures == 2
    scraper = MetricsScraper(
        ds, EppMetrics(ds), on_unreachable=ejector.failure, on_success=ejector.success
    )
    scraper.start()
    try:
        await until(lambda: ejector.state(endpoint.address).failures == 0, "reset by a scrape")
    finally:
        await scraper.stop()
    ejector.failure(endpoint.address, "HTTP 503 on the response path")  # 1, not 3
    member = ds.member(endpoint.address)
    assert member is not None and member.status is Status.ACTIVE


def _handoff(prefill: Endpoint) -> Handoff:
    request = InferenceRequest("r1", "sim-model", "/v1/completions", "x" * 2000)
    doc = {"model": "sim-model", "prompt": "x" * 2000, "max_tokens": 4}
    return Handoff(request, doc, prefill, Endpoint("127.0.0.1", 9, Role.DECODE))


def _legs(metrics: EppMetrics) -> dict[str, float]:
    out = {}
    for family in metrics.registry.collect():
        if family.name == "epp_prefill_legs":
            for s in family.samples:
                if s.name.endswith("_total"):
                    out[s.labels["outcome"]] = s.value
    return out


async def _run_leg(port: int) -> tuple[dict[str, float], Ejector, str]:
    ds, ejector, endpoint = _pool(port)
    ejector.failure(endpoint.address, "connect failure")
    ejector.failure(endpoint.address, "connect failure")
    metrics = EppMetrics(ds)
    legs = LegClient(AiohttpLegTransport(1.0, 10.0))
    env = CoordinatorEnv(ds, metrics, legs, random.Random(0), None, ejector.success)
    try:
        await NixlCoordinator(env).hand_off(_handoff(endpoint))
    finally:
        await legs.close()
    return _legs(metrics), ejector, endpoint.address


async def test_a_good_prefill_leg_counts_once_and_resets_failures(prefill: SimProc) -> None:
    legs, ejector, address = await _run_leg(prefill.port)
    assert legs == {"ok": 1.0}
    assert ejector.state(address).failures == 0


@pytest.fixture
async def no_params_server() -> AsyncIterator[int]:
    """A prefill server that answers 200 without kv_transfer_params."""

    async def complete(_: web.Request) -> web.Response:
        return web.json_response({"id": "c", "choices": [{"text": "x"}]})

    app = web.Application()
    app.router.add_post("/v1/completions", complete)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield runner.addresses[0][1]
    finally:
        await runner.cleanup()


async def test_a_leg_without_kv_params_counts_once(no_params_server: int) -> None:
    legs, ejector, address = await _run_leg(no_params_server)
    assert legs == {"no_kv_params": 1.0}  # not also "ok"
    assert ejector.state(address).failures == 0  # the server answered: it is alive


@pytest.fixture
async def failing_prefill() -> AsyncIterator[int]:
    """A prefill server that answers every leg with a 503."""

    async def complete(_: web.Request) -> web.Response:
        return web.json_response({"error": {"message": "overloaded"}}, status=503)

    app = web.Application()
    app.router.add_post("/v1/completions", complete)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield runner.addresses[0][1]
    finally:
        await runner.cleanup()


async def test_a_failed_prefill_leg_counts_against_the_prefill_server(
    failing_prefill: int,
) -> None:
    ds, ejector, endpoint = _pool(failing_prefill)
    metrics = EppMetrics(ds)
    legs = LegClient(AiohttpLegTransport(1.0, 10.0))
    env = CoordinatorEnv(
        ds,
        metrics,
        legs,
        random.Random(0),
        None,
        ejector.success,
        lambda address, reason, serving: ejector.failure(address, reason, serving=serving),
    )
    try:
        await NixlCoordinator(env).hand_off(_handoff(endpoint))
    finally:
        await legs.close()
    assert _legs(metrics) == {"failed": 1.0}
    assert ejector.state(endpoint.address).failures == 1
