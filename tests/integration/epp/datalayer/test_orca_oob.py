"""Out-of-band ORCA end to end: real simulators serving OpenRcaService (``--orca-port``),
the real OrcaStreams client, a real Datastore."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from epp.datalayer.orca_oob import OrcaStreams
from epp.datastore import Datastore
from epp.observability.metrics import EppMetrics
from epp.types import Endpoint
from epp_harness.procs import ManagedProcess, start_epp
from tests.support.http import open_raw_post
from tests.support.wait import until

INTERVAL_S = 0.02


def start_sim(workdir: Path, name: str, *args: str) -> ManagedProcess:
    return start_epp(workdir, name, "sim", "--port", "0", *args)


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[ManagedProcess]:
    proc = start_sim(tmp_path, "sim", "--orca-port", "0", "--kv-blocks", "100")
    try:
        yield proc
    finally:
        assert proc.stop() == 0
        assert "Traceback" not in proc.log_tail(500)


@pytest.fixture
def refused_port() -> Iterator[int]:
    """A port bound but not listening: connections to it are refused for the whole test."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


def oob_ok(metrics: EppMetrics) -> float:
    value = metrics.registry.get_sample_value(
        "epp_orca_reports_total", {"source": "oob", "result": "ok"}
    )
    return value or 0.0


def other_tasks() -> set[asyncio.Task[object]]:
    return {t for t in asyncio.all_tasks() if t is not asyncio.current_task()}


async def test_reports_land_in_the_datastore_and_follow_live_load(
    sim: ManagedProcess, refused_port: int
) -> None:
    ds = Datastore()
    metrics = EppMetrics(ds)
    served = Endpoint("127.0.0.1", sim.info["port"])
    down = Endpoint("127.0.0.1", 1)  # its ORCA port refuses connections
    plain = Endpoint("127.0.0.1", 2)  # no ORCA port at all
    ports = {served.address: sim.info["orca_port"], down.address: refused_port}
    for endpoint in (served, down, plain):
        ds.add(endpoint)
    streams = OrcaStreams(
        ds, metrics, port_for=lambda e: ports.get(e.address), report_interval_s=INTERVAL_S
    )
    streams.start()
    try:
        state = await until(
            lambda: (s := ds.get(served.address)) and s.metrics and s.metrics.orca and s,
            "a first report",
        )
        assert state.metrics is not None
        assert state.metrics.kv_usage == 0.0 and state.metrics.running == 0.0
        assert state.metrics.waiting == 0.0
        assert set(state.metrics.orca) == {
            "named_metrics.kv_cache_usage_perc",
            "named_metrics.num_requests_waiting",
            "named_metrics.num_requests_running",
        }
        assert streams.streaming() == [served.address]

        # live load shows up in the next reports (a long streaming request holds a slot)
        body = {"model": "sim-model", "prompt": "x" * 400, "max_tokens": 5000, "stream": True}
        conn = open_raw_post(sim.info["url"], "/v1/completions", json.dumps(body).encode())
        try:

            def busy() -> bool:
                state = ds.get(served.address)
                m = state.metrics if state else None
                return m is not None and m.running == 1.0 and (m.kv_usage or 0) > 0

            await until(busy, "a report showing the running request")
        finally:
            conn.close()
        await until(
            lambda: (s := ds.get(served.address)) and s.metrics and s.metrics.running == 0.0,
            "a report showing it finished",
        )

        # the unreachable and the ORCA-less endpoint got nothing and broke nothing
        for endpoint in (down, plain):
            state = ds.get(endpoint.address)
            assert state is not None and state.metrics is None
        assert oob_ok(metrics) >= 3

        # leaving the pool ends that endpoint's stream
        ds.remove(served.address)
        await until(lambda: streams.streaming() == [], "the stream to end")
        count = oob_ok(metrics)
        ds.add(served)
        await until(lambda: oob_ok(metrics) > count, "reports after re-adding the endpoint")
    finally:
        await streams.stop()
    assert not [t for t in other_tasks() if t.get_name().startswith("orca-oob:")]
    # grpc finishes its own per-call bookkeeping task within a loop turn or two
    await until(lambda: not other_tasks(), "every task to finish")
    assert streams.streaming() == []


async def test_reconnects_when_the_orca_server_comes_back(tmp_path: Path) -> None:
    first = start_sim(tmp_path, "sim-1", "--orca-port", "0")
    orca_port = first.info["orca_port"]
    ds = Datastore()
    metrics = EppMetrics(ds)
    endpoint = Endpoint("127.0.0.1", first.info["port"])
    ds.add(endpoint)
    streams = OrcaStreams(ds, metrics, port_for=lambda e: orca_port, report_interval_s=INTERVAL_S)
    streams.start()
    second: ManagedProcess | None = None
    try:
        await until(lambda: streams.streaming() == [endpoint.address], "the first stream")
        assert first.stop() == 0
        await until(lambda: streams.streaming() == [], "the client to see the stream end")
        count = oob_ok(metrics)
        second = start_sim(tmp_path, "sim-2", "--orca-port", str(orca_port))
        assert second.info["orca_port"] == orca_port
        await until(lambda: oob_ok(metrics) > count, "reports from the restarted server")
        assert streams.streaming() == [endpoint.address]
    finally:
        await streams.stop()
        if second is not None:
            assert second.stop() == 0
        first.stop()
    await until(lambda: not other_tasks(), "every task to finish")


async def test_stop_right_after_start_and_twice_is_clean(refused_port: int) -> None:
    ds = Datastore()
    ds.add(Endpoint("127.0.0.1", 1))
    streams = OrcaStreams(ds, EppMetrics(ds), port_for=lambda e: refused_port)
    streams.start()
    await asyncio.sleep(0)  # let the task begin connecting
    await streams.stop()
    await streams.stop()
    await until(lambda: not other_tasks(), "every task to finish")


def test_report_interval_must_be_positive() -> None:
    ds = Datastore()
    with pytest.raises(ValueError, match="report_interval_s"):
        OrcaStreams(ds, EppMetrics(ds), port_for=lambda e: None, report_interval_s=0)
