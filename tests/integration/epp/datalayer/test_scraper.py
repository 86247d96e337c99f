"""MetricsScraper against real ``epp sim`` processes (and, for failure modes a simulator
cannot produce on demand, a small aiohttp server in the test's own loop).

The scraper runs in the test's event loop, so the tests wait on conditions with
:func:`until` (asyncio polling), never with fixed sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from epp.datalayer.scraper import MetricsScraper, ScrapePace
from epp.datastore import Datastore
from epp.observability.metrics import EppMetrics
from epp.types import Endpoint, EndpointMetrics
from epp_harness.procs import ManagedProcess, start_epp
from tests.support.wait import until

MODEL = "scrape-model"
SCRAPER_LOG = "epp.datalayer.scraper"
SAFETY_S = 60.0  # an outer bound on waits that end by themselves

VLLM_PAGE = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{model_name="m"}} {running}
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{model_name="m"}} {waiting}
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{model_name="m"}} 0.5
"""


def start_sim(workdir: Path, name: str, *args: str) -> ManagedProcess:
    return start_epp(workdir, name, "sim", "--port", "0", "--model", MODEL, *args)


def sim_endpoint(proc: ManagedProcess, engine: str = "vllm") -> Endpoint:
    return Endpoint(proc.info["host"], proc.info["port"], engine=engine)


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagedProcess]:
    """An idle simulator with a distinctive KV-cache geometry, shared by the module."""
    proc = start_sim(
        tmp_path_factory.mktemp("scrape"),
        "sim",
        "--kv-blocks",
        "1234",
        "--block-size",
        "32",
        "--time-scale",
        "0",
    )
    yield proc
    assert proc.stop() == 0


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A loopback port with nothing listening (held bound, so nobody else takes it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


@dataclass
class Env:
    datastore: Datastore
    metrics: EppMetrics
    scraper: MetricsScraper

    def failures(self, address: str) -> float:
        value = self.metrics.registry.get_sample_value(
            "epp_scrape_failures_total", {"endpoint": address}
        )
        return value or 0.0

    def metrics_of(self, address: str) -> EndpointMetrics | None:
        state = self.datastore.get(address)
        return None if state is None else state.metrics


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    datastore = Datastore()
    metrics = EppMetrics(datastore)
    scraper = MetricsScraper(datastore, metrics, ScrapePace(interval_s=0.02, timeout_s=1.0))
    yield Env(datastore, metrics, scraper)
    await scraper.stop()


def scrape_tasks() -> list[asyncio.Task[Any]]:
    return [t for t in asyncio.all_tasks() if t.get_name().startswith("scrape:") and not t.done()]


def scraper_records(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == SCRAPER_LOG and r.levelno == level]


# -- real simulators -------------------------------------------------------------------


async def test_sim_metrics_land_in_the_datastore(sim: ManagedProcess, env: Env) -> None:
    endpoint = sim_endpoint(sim)
    env.datastore.add(endpoint)
    # an ORCA report already stored survives scrapes (it is another source's data)
    env.datastore.update_metrics(
        endpoint.address, EndpointMetrics(updated_at=0.0, orca={"cpu_utilization": 0.5})
    )
    env.scraper.start()
    first = await until(
        lambda: (m := env.metrics_of(endpoint.address)) is not None and m.updated_at > 0 and m,
        what="first scrape",
    )
    assert first.block_size == 32 and first.num_blocks == 1234  # the sim's flags
    assert (first.waiting, first.running, first.kv_usage) == (0.0, 0.0, 0.0)
    assert first.max_lora is None and first.lora_running == frozenset()
    assert first.orca == {"cpu_utilization": 0.5}
    assert first.updated_at <= time.monotonic()
    await until(
        lambda: (
            (m := env.metrics_of(endpoint.address)) is not None and m.updated_at > first.updated_at
        ),
        what="updated_at to advance",
    )
    assert await env.scraper.scrape_once(endpoint) is True
    assert env.failures(endpoint.address) == 0


async def test_running_request_is_scraped(tmp_path: Path, env: Env) -> None:
    # 20 ms per token x 10,000 tokens: runs until the client goes away
    proc = start_sim(tmp_path, "slow", "--decode-ms-per-token", "20")
    endpoint = sim_endpoint(proc)
    try:
        env.datastore.add(endpoint)
        env.scraper.start()
        await until(lambda: env.metrics_of(endpoint.address), what="first scrape")
        assert env.metrics_of(endpoint.address).running == 0.0  # type: ignore[union-attr]

        async def slow_request() -> None:
            async with (
                aiohttp.ClientSession() as session,
                session.post(
                    f"{proc.info['url']}/v1/completions",
                    json={"model": MODEL, "prompt": "hello " * 50, "max_tokens": 10_000},
                ) as resp,
            ):
                await resp.read()

        request = asyncio.create_task(slow_request())
        try:
            busy = await until(
                lambda: (
                    (m := env.metrics_of(endpoint.address)) is not None and m.running == 1.0 and m
                ),
                what="running == 1",
            )
            assert busy.waiting == 0.0
            assert busy.kv_usage is not None and busy.kv_usage > 0
        finally:
            request.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await request
        # the client went away: the sim frees the slot and the scraper sees it
        await until(
            lambda: (m := env.metrics_of(endpoint.address)) is not None and m.running == 0.0,
            what="running back to 0",
        )
    finally:
        await asyncio.to_thread(proc.stop)


async def test_nothing_listening_counts_failures_quietly(
    closed_port: int, env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger=SCRAPER_LOG)
    endpoint = Endpoint("127.0.0.1", closed_port)
    env.datastore.add(endpoint)
    env.scraper.start()
    await until(lambda: env.failures(endpoint.address) >= 5, what="5 failures")
    assert env.metrics_of(endpoint.address) is None
    assert await env.scraper.scrape_once(endpoint) is False
    warnings = scraper_records(caplog, logging.WARNING)
    assert len(warnings) == 1, warnings  # one warning, then debug: no log spam
    assert endpoint.address in warnings[0] and "Cannot connect" in warnings[0]
    assert len(scraper_records(caplog, logging.DEBUG)) >= 4


async def test_killed_sim_stops_updates_and_counts_failures(tmp_path: Path, env: Env) -> None:
    proc = start_sim(tmp_path, "doomed", "--time-scale", "0", "--block-size", "8")
    endpoint = sim_endpoint(proc)
    try:
        env.datastore.add(endpoint)
        env.scraper.start()
        await until(lambda: env.metrics_of(endpoint.address), what="first scrape")
    finally:
        assert await asyncio.to_thread(proc.stop) == 0
    await until(lambda: env.failures(endpoint.address) >= 2, what="failures after the kill")
    last = env.metrics_of(endpoint.address)
    assert last is not None
    seen = env.failures(endpoint.address)
    await until(lambda: env.failures(endpoint.address) >= seen + 5, what="more failures")
    # the last good metrics stay, untouched: their age is the scheduler's staleness signal
    assert env.metrics_of(endpoint.address) is last
    assert last.block_size == 8


async def test_unknown_engine_counts_failures(
    sim: ManagedProcess, env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger=SCRAPER_LOG)
    endpoint = sim_endpoint(sim, engine="tgi")
    env.datastore.add(endpoint)
    env.scraper.start()
    await until(lambda: env.failures(endpoint.address) >= 3, what="failures")
    assert env.metrics_of(endpoint.address) is None
    (warning,) = scraper_records(caplog, logging.WARNING)
    assert "unknown model-server engine 'tgi'" in warning and "vllm" in warning


async def test_removed_endpoint_loses_its_task(
    sim: ManagedProcess, closed_port: int, env: Env
) -> None:
    live, dead = sim_endpoint(sim), Endpoint("127.0.0.1", closed_port)
    env.datastore.add(live)
    env.datastore.add(dead)
    env.scraper.start()
    assert env.scraper.addresses() == sorted([live.address, dead.address])
    await until(lambda: env.metrics_of(live.address), what="first scrape")
    env.datastore.remove(live.address)
    assert env.scraper.addresses() == [dead.address]
    await until(
        lambda: [t.get_name() for t in scrape_tasks()] == [f"scrape:{dead.address}"],
        what="the removed endpoint's task to end",
    )
    assert env.datastore.get(live.address) is None  # no late scrape brought it back
    # re-adding starts a new loop
    env.datastore.add(live)
    assert env.scraper.addresses() == sorted([live.address, dead.address])
    await until(lambda: env.metrics_of(live.address), what="scrape after re-adding")


async def test_stop_leaves_no_pending_tasks(
    sim: ManagedProcess, closed_port: int, env: Env
) -> None:
    live = sim_endpoint(sim)
    env.datastore.add(live)
    env.datastore.add(Endpoint("127.0.0.1", closed_port))
    env.scraper.start()
    env.scraper.start()  # idempotent
    await until(lambda: env.metrics_of(live.address), what="first scrape")
    assert len(scrape_tasks()) == 2
    await env.scraper.stop()
    assert scrape_tasks() == []
    assert env.scraper.addresses() == []
    env.datastore.add(Endpoint("127.0.0.1", 1))  # nothing starts after stop
    await asyncio.sleep(0)
    assert scrape_tasks() == []
    with pytest.raises(RuntimeError, match="before start"):
        await env.scraper.scrape_once(live)
    await env.scraper.stop()  # twice is fine


# -- failure modes served on demand ----------------------------------------------------


@dataclass
class Page:
    status: int = 200
    body: str = VLLM_PAGE.format(running=1, waiting=2)
    hang: bool = False


@pytest.fixture
async def fake_server() -> AsyncIterator[tuple[Page, str]]:
    """A /metrics server in the test's loop serving whatever ``Page`` says; yields
    (page, address)."""
    page = Page()
    release = asyncio.Event()

    async def metrics(_: web.Request) -> web.Response:
        if page.hang:
            await release.wait()
        return web.Response(status=page.status, text=page.body)

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    yield page, f"127.0.0.1:{port}"
    release.set()
    await runner.cleanup()


async def test_bad_answers_keep_the_last_good_metrics(
    fake_server: tuple[Page, str], env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger=SCRAPER_LOG)
    page, address = fake_server
    env.datastore.add(Endpoint("127.0.0.1", int(address.rsplit(":", 1)[1])))
    env.scraper.start()
    good = await until(lambda: env.metrics_of(address), what="first scrape")
    assert (good.running, good.waiting, good.kv_usage) == (1.0, 2.0, 0.5)

    for status, body, reason in [
        (503, "overloaded", "HTTP 503"),
        (200, "<html>oops</html>", "no vllm metrics"),
        (200, 'vllm:num_requests_waiting{model_name="m"} many\n', "malformed line"),
    ]:
        page.status, page.body = status, body
        target = env.failures(address) + 3
        await until(lambda t=target: env.failures(address) >= t, what=f"failures on {reason}")
        assert env.metrics_of(address) is good  # never garbage, never a fresher updated_at
        assert any(reason in m for m in scraper_records(caplog, logging.DEBUG))

    page.status, page.body = 200, VLLM_PAGE.format(running=4, waiting=0)
    await until(
        lambda: (m := env.metrics_of(address)) is not None and m.running == 4.0,
        what="recovery",
    )
    # one warning for the whole failing streak, one info when it ends
    warnings = scraper_records(caplog, logging.WARNING)
    assert len(warnings) == 1 and "HTTP 503" in warnings[0]
    assert scraper_records(caplog, logging.INFO) == [f"scraping {address}/metrics works again"]


async def test_timeout_is_a_failure_and_cancel_still_works(fake_server: tuple[Page, str]) -> None:
    page, address = fake_server
    page.hang = True
    datastore = Datastore()
    metrics = EppMetrics(datastore)
    endpoint = Endpoint("127.0.0.1", int(address.rsplit(":", 1)[1]))
    datastore.add(endpoint)
    scraper = MetricsScraper(datastore, metrics, ScrapePace(interval_s=0.01, timeout_s=0.1))
    scraper.start()
    try:
        started = time.monotonic()
        # the server never answers: only the timeout ends the scrape (within the safety
        # bound, however slow the machine)
        assert await asyncio.wait_for(scraper.scrape_once(endpoint), SAFETY_S) is False
        assert time.monotonic() - started >= 0.09
        failures = metrics.registry.get_sample_value(
            "epp_scrape_failures_total", {"endpoint": address}
        )
        assert failures is not None and failures >= 1
        assert datastore.get(address).metrics is None  # type: ignore[union-attr]
        # The loop's own scrape (started with ours) timed out in this same loop
        # iteration, so removing the endpoint cancels its task just after its timer
        # fired. With aiohttp's ClientTimeout that cancel was swallowed and the loop
        # ran on forever (aio-libs/aiohttp#5979).
        datastore.remove(address)
        await until(lambda: scrape_tasks() == [], within=3, what="the loop to end")
    finally:
        await scraper.stop()


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
            sock.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback here")
async def test_ipv6_endpoint(env: Env) -> None:
    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=VLLM_PAGE.format(running=3, waiting=0))

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        await web.TCPSite(runner, "::1", 0).start()
        endpoint = Endpoint("::1", runner.addresses[0][1])
        assert endpoint.address.startswith("[::1]:")
        env.datastore.add(endpoint)
        env.scraper.start()
        m = await until(lambda: env.metrics_of(endpoint.address), what="scrape over IPv6")
        assert m.running == 3.0
    finally:
        await env.scraper.stop()
        await runner.cleanup()


def test_the_pace_rejects_bad_settings() -> None:
    for kwargs in (
        {"interval_s": 0},
        {"timeout_s": -1},
        {"jitter": 1.0},
        {"jitter": -0.1},
        {"max_per_s": -1},
        {"stale_after_s": 0},
    ):
        with pytest.raises(ValueError):
            ScrapePace(**kwargs)  # type: ignore[arg-type]


def test_start_needs_a_running_loop() -> None:
    datastore = Datastore()
    scraper = MetricsScraper(datastore, EppMetrics(datastore))
    with pytest.raises(RuntimeError):
        scraper.start()


async def test_a_pool_over_the_budget_is_scraped_less_often(
    closed_port: int, caplog: pytest.LogCaptureFixture
) -> None:
    """Unreachable endpoints (connection refused at once) still get one loop each, so
    the loops' pace is the budget's alone."""
    caplog.set_level(logging.INFO, SCRAPER_LOG)
    datastore = Datastore()
    metrics = EppMetrics(datastore)
    # stretched at most to (0.25 - 0.01) / 2.4 = 0.1 s
    scraper = MetricsScraper(
        datastore,
        metrics,
        ScrapePace(interval_s=0.01, max_per_s=100, stale_after_s=0.25, timeout_s=0.01),
    )

    def gauge() -> float | None:
        return metrics.registry.get_sample_value("epp_scrape_interval_seconds")

    def scrapes() -> float:
        return metrics.registry.get_sample_value("epp_scrapes_total") or 0.0

    def budget_logs(level: int) -> list[str]:
        return [m for m in scraper_records(caplog, level) if "budget" in m]

    addresses = [f"127.0.0.{i + 2}" for i in range(20)]
    for host in addresses[:5]:
        datastore.add(Endpoint(host, closed_port))
    scraper.start()
    try:
        await until(lambda: gauge() == pytest.approx(0.05), what="5 endpoints: 5 / 100 s")
        for host in addresses[5:]:
            datastore.add(Endpoint(host, closed_port))
        await until(lambda: gauge() == pytest.approx(0.1), what="20 endpoints: the ceiling")
        await until(lambda: budget_logs(logging.WARNING), what="the over-budget warning")
        assert "20 endpoints scraped every 0.1s is 200 scrapes/s" in budget_logs(logging.WARNING)[0]
        # each loop waits >= 0.08 s (0.1 less 20 % jitter): <= 250 scrapes a second in
        # all, where 20 loops every 10 ms would make 2,000
        first, started = scrapes(), time.monotonic()
        await asyncio.sleep(1.0)
        elapsed = time.monotonic() - started
        assert scrapes() - first <= 20 / 0.08 * elapsed + 20
        for host in addresses[1:]:
            datastore.remove(f"{host}:{closed_port}")
        await until(lambda: gauge() == pytest.approx(0.01), what="one endpoint: the interval")
        await until(lambda: budget_logs(logging.INFO), what="back within the budget")
        assert len(budget_logs(logging.WARNING)) == 1  # once per excursion, not per loop
    finally:
        await scraper.stop()


@pytest.mark.parametrize(("budget", "first_round"), [(0.0, 20), (100.0, 0)])
async def test_a_stretched_pool_spreads_its_first_scrapes(
    closed_port: int, budget: float, first_round: int
) -> None:
    """Without the budget every new loop scrapes at once; with it (20 endpoints at 100/s
    stretch 0.01 s to 0.1 s) each first waits a random part of the stretch."""
    datastore = Datastore()
    metrics = EppMetrics(datastore)
    scraper = MetricsScraper(
        datastore,
        metrics,
        ScrapePace(interval_s=0.01, max_per_s=budget, stale_after_s=0.25, timeout_s=0.01),
    )
    for i in range(20):
        datastore.add(Endpoint(f"127.0.0.{i + 2}", closed_port))
    scraper.start()
    try:
        await asyncio.sleep(0)  # every new loop takes its first step, then we go on
        assert metrics.registry.get_sample_value("epp_scrapes_total") == first_round
    finally:
        await scraper.stop()
