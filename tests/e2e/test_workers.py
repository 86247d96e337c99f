"""``epp serve --workers 2`` through a real Envoy: streams spread over both workers, an
admin-API add reaches both before the call returns, in-flight counts return to zero in
both, and a SIGKILLed worker costs no client error once Envoy's health checks have
taken it out (the parent restarts it on its port)."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from epp.datalayer.settings import DataLayerConfig
from epp_harness.stack import LocalStack
from tests.e2e.conftest import ephemeral
from tests.support.envoy_admin import host_health
from tests.support.http import request
from tests.support.load import Load
from tests.support.wait import quiesce, wait_for

KEY = "test-admin-key"
SCRAPE_INTERVAL_S = DataLayerConfig().scrape_interval_s
BODY = orjson.dumps({"model": "sim-model", "prompt": "hello", "max_tokens": 8})


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    files = tmp_path_factory.mktemp("files")
    (files / "admin.key").write_text(KEY + "\n")
    (files / "epp.yaml").write_text(f"dataLayer: {{scrapeIntervalSeconds: {SCRAPE_INTERVAL_S}}}\n")
    opts = ephemeral(
        servers=2,
        workers=2,
        sim_args=["--time-scale", "0.05"],
        epp_args=[
            "--admin-api-key-file", str(files / "admin.key"),
            "--config", str(files / "epp.yaml"), "--config-poll-seconds", "0",
        ],
    )  # fmt: skip
    with LocalStack(opts) as s:
        yield s


def workers(stack: LocalStack) -> list[dict[str, Any]]:
    _, _, body = request(f"{stack.epp_http_url}/workers")
    listed: list[dict[str, Any]] = json.loads(body)["workers"]
    return listed


def worker_metrics(worker: dict[str, Any]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    _, _, text = request(f"http://127.0.0.1:{worker['http_port']}/metrics")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text.decode())
        for s in family.samples
    }


def streams(worker: dict[str, Any]) -> float:
    return sum(v for (name, _), v in worker_metrics(worker).items() if name == "epp_requests_total")


def in_flight(worker: dict[str, Any], name: str = "epp_in_flight_requests") -> float:
    return sum(v for (n, _), v in worker_metrics(worker).items() if n == name)


def epp_hosts(stack: LocalStack) -> dict[int, str]:
    """The ext_proc cluster's hosts in Envoy (port -> health flags)."""
    assert stack.envoy is not None
    hosts = host_health(stack.envoy.admin_url, "epp")
    return {int(address.rsplit(":", 1)[1]): flags for address, flags in hosts.items()}


def test_the_ready_file_and_envoy_list_every_worker(stack: LocalStack) -> None:
    listed = workers(stack)
    assert [w["index"] for w in listed] == [0, 1]
    assert stack.grpc_ports == [w["grpc_port"] for w in listed]
    assert stack.grpc_ports[0] == stack.grpc_port and len(set(stack.grpc_ports)) == 2
    wait_for(
        lambda: epp_hosts(stack) == {p: "healthy" for p in stack.grpc_ports},
        what="both workers healthy in Envoy",
    )


def test_each_endpoint_is_scraped_once_per_interval_not_once_per_worker(
    stack: LocalStack,
) -> None:
    def scrapes() -> float:
        _, _, text = request(f"{stack.epp_http_url}/metrics")
        return sum(
            s.value
            for f in text_string_to_metric_families(text.decode())
            for s in f.samples
            if s.name == "epp_scrapes_total"
        )

    first, began = scrapes(), time.monotonic()
    time.sleep(2.0)  # a rate needs a window
    rate = (scrapes() - first) / (time.monotonic() - began) / len(stack.sim_addresses)
    print(f"scrapes per endpoint per second with 2 workers: {rate:.1f} (interval 50 ms: 20)")
    assert rate <= 1 / SCRAPE_INTERVAL_S * 1.25  # one scraper, not one per worker


def test_requests_spread_over_both_workers_and_in_flight_returns_to_zero(
    stack: LocalStack,
) -> None:
    listed = workers(stack)
    quiesce(stack)
    before = [streams(w) for w in listed]
    with Load(f"{stack.envoy_url}/v1/completions", [BODY] * 8) as load:
        # each worker counts the other's requests too (docs/workers.md)
        wait_for(
            lambda: all(in_flight(w, "epp_peer_in_flight_requests") > 0 for w in listed),
            timeout=30,
            what="each worker seeing the other's requests in flight",
        )
        wait_for(
            lambda: all(in_flight(w, "epp_extproc_open_streams") > 0 for w in listed),
            timeout=30,
            what="each worker with ext_proc streams open",
        )
        wait_for(lambda: len(load.results) >= 200, timeout=60, what="200 requests")
    assert load.errors() == []
    quiesce(stack)  # on the parent's page: both workers' open streams summed, back to 0
    counts = [streams(w) - b for w, b in zip(listed, before, strict=True)]
    share = counts[0] / sum(counts)
    print(f"requests per worker: {counts} (worker 0: {share:.0%})")
    assert all(c > 0 for c in counts) and 0.2 < share < 0.8
    wait_for(lambda: [in_flight(w) for w in listed] == [0, 0], what="in-flight to drain")
    wait_for(
        lambda: [in_flight(w, "epp_peer_in_flight_requests") for w in listed] == [0, 0],
        what="the peers' counts to drain",
    )
    assert [in_flight(w, "epp_peers") for w in listed] == [1, 1]
    # the parent's page sums both workers' counters
    _, _, text = request(f"{stack.epp_http_url}/metrics")
    merged = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text.decode())
        for s in f.samples
    }
    routed = (("outcome", "routed"),)
    assert merged[("epp_requests_total", routed)] == sum(
        worker_metrics(w)[("epp_requests_total", routed)] for w in listed
    )
    assert ("process_cpu_seconds_total", (("worker", "1"),)) in merged
    assert merged[("epp_extproc_open_streams", ())] == 0  # summed: one series, no worker label


def test_an_admin_add_reaches_both_workers_before_it_returns(stack: LocalStack) -> None:
    sim = stack.start_sim("added", "--port", "0")
    stack.sims.append(sim)
    info = sim.wait_ready()
    address = f"{info['host']}:{info['port']}"
    status, _, body = request(
        f"{stack.epp_http_url}/instances/add",
        orjson.dumps({"type": "decode", "instance": address}),
        headers={"X-Api-Key": KEY},
    )
    assert status == 200, body
    for w in workers(stack):  # no wait: each worker's own /status has it already
        _, _, raw = request(f"http://127.0.0.1:{w['http_port']}/status")
        states = {e["instance"]: e["state"] for e in json.loads(raw)["endpoints"]}
        assert states.get(address) == "healthy", (w["index"], states)


def test_sighup_to_the_parent_reloads_every_worker(stack: LocalStack) -> None:
    def reloads(worker: dict[str, Any]) -> float:
        found = worker_metrics(worker).get(("epp_config_reloads_total", (("result", "success"),)))
        return found or 0.0

    listed = workers(stack)
    before = [reloads(w) for w in listed]
    assert stack.epp is not None and stack.epp.pid is not None
    os.kill(stack.epp.pid, signal.SIGHUP)
    wait_for(
        lambda: [reloads(w) - b for w, b in zip(listed, before, strict=True)] == [1, 1],
        what="both workers to reload",
    )


def test_a_killed_worker_costs_no_error_once_envoy_sees_it_gone(stack: LocalStack) -> None:
    victim = workers(stack)[1]
    port = victim["grpc_port"]
    wait_for(lambda: epp_hosts(stack).get(port) == "healthy", what="worker 1 healthy")
    with Load(f"{stack.envoy_url}/v1/completions", [BODY] * 6) as load:
        wait_for(lambda: len(load.results) > 30, what="load before the kill")
        os.kill(victim["pid"], signal.SIGKILL)
        killed = time.monotonic()
        last_error = killed
        errors_then = len(load.errors())
        while "failed_active_hc" not in epp_hosts(stack).get(port, ""):
            if len(load.errors()) > errors_then:
                errors_then, last_error = len(load.errors()), time.monotonic()
            assert time.monotonic() - killed < 60, "Envoy's health check never saw it"
            time.sleep(0.01)
        seen_after = time.monotonic() - killed
        seen = len(load.results)
        wait_for(lambda: len(load.results) > seen + 50, timeout=30, what="load after the kill")
        after = load.results[seen:]
        wait_for(
            lambda: workers(stack)[1]["connected"] and workers(stack)[1]["pid"] != victim["pid"],
            timeout=30,
            what="the parent to restart worker 1",
        )
        restarted_after = time.monotonic() - killed
        wait_for(lambda: epp_hosts(stack).get(port) == "healthy", what="worker 1 healthy again")
        back = streams(workers(stack)[1])
        wait_for(lambda: streams(workers(stack)[1]) > back, what="worker 1 serving again")
    errors = load.errors()
    print(
        f"worker kill: {len(load.results)} requests, {len(errors)} errors, the last "
        f"{last_error - killed:.2f}s after the kill; Envoy's health check saw it "
        f"{seen_after:.2f}s after it, the parent had it back {restarted_after:.2f}s after it"
    )
    assert [r for r in after if r.status != 200] == []
    assert workers(stack)[1]["grpc_port"] == port and workers(stack)[1]["restarts"] == 1
