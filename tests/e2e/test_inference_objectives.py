"""InferenceObjectives end to end: ``epp serve --pool-name`` reads them from a loopback
fake API server, and a request naming one through the real Envoy gets its priority:
while the pool is full (one server, the EPP keeping one request on it), a sheddable
objective's request is refused at once and a critical one waits in its own band. The
same with ``--workers 2``: the parent watches, each worker's scheduler follows it."""

from __future__ import annotations

import http.client
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

import orjson
import pytest

from epp_harness.stack import LocalStack
from tests.e2e.conftest import ephemeral
from tests.support.http import epp_in_flight, get_json, request
from tests.support.kube_objects import objective, pod, pool
from tests.support.kube_server import FakeKubeThread, write_kubeconfig
from tests.support.wait import wait_for

pytestmark = pytest.mark.e2e
CONFIG = (
    "saturationDetector: {maxConcurrency: 1}\nflowControl: {enabled: true, shedSheddable: true}\n"
)


@pytest.fixture(scope="module", params=[1, 2], ids=["one process", "2 workers"])
def stack(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[LocalStack]:
    with FakeKubeThread().running() as kube:
        workdir = tmp_path_factory.mktemp("objectives")
        kubeconfig = write_kubeconfig(workdir / "kubeconfig", kube.url)
        (workdir / "epp.yaml").write_text(CONFIG)
        opts = ephemeral(
            servers=1, workers=request.param, workdir=workdir, static_endpoints=False,
            sim_args=["--time-scale", "0.5"],
            log_level="info",  # the log line that says the objectives arrived
            epp_args=["--pool-name", "qwen-pool", "--pool-namespace", "default",
                      "--kubeconfig", str(kubeconfig), "--secure-serving=false",
                      "--config", str(workdir / "epp.yaml")],
        )  # fmt: skip
        with LocalStack(opts) as s:
            port = int(s.sim_addresses[0].rsplit(":", 1)[1])
            for resource, obj in (
                ("inferenceobjectives", objective("batch", -1)),
                ("inferenceobjectives", objective("critical", 5)),
                ("pods", pod("a", "127.0.0.1")),
                ("inferencepools", pool(target_ports=[port])),
            ):
                kube.call(lambda r=resource, o=obj: kube.fake.apply(r, o))  # type: ignore[misc]
            wait_for(lambda: get_json(f"{s.epp_http_url}/health")["endpoints"] == 1)
            log = workdir / "epp.log"
            wait_for(
                lambda: (
                    "InferenceObjectives for pool default/qwen-pool: batch=-1, critical=5"
                    in log.read_text()
                ),
                what="the objectives watched",
            )
            yield s


def complete(stack: LocalStack, prompt: str, tokens: int, **headers: str) -> tuple[int, Any]:
    body = orjson.dumps({"model": "sim-model", "prompt": prompt, "max_tokens": tokens})
    status, _, raw = request(f"{stack.envoy_url}/v1/completions", body, headers=headers)
    return status, orjson.loads(raw)


def queues(stack: LocalStack) -> list[tuple[int, int]]:
    """(priority, requests) of each flow-control queue that holds any, in every process
    that serves ext_proc (with workers, those hold the queues)."""
    urls = [stack.epp_http_url]
    if stack.opts.workers > 1:
        listed = get_json(f"{stack.epp_http_url}/workers")["workers"]
        urls = [f"http://127.0.0.1:{w['http_port']}" for w in listed]
    return [
        (q["priority"], q["requests"])
        for url in urls
        for q in get_json(f"{url}/status")["flow_control"]["queues"]
        if q["requests"]
    ]


def hold_busy(stack: LocalStack) -> http.client.HTTPConnection:
    """A streamed completion that outlasts the test (minutes of tokens): the server stays
    busy until the test closes the connection, not for as long as a fixed length of
    output happens to take on a loaded machine."""
    parts = urlsplit(stack.envoy_url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    body = {"model": "sim-model", "prompt": "a long one", "max_tokens": 100_000, "stream": True}
    conn.request(
        "POST", "/v1/completions", orjson.dumps(body), {"content-type": "application/json"}
    )
    assert conn.getresponse().status == 200
    return conn


def test_an_objectives_priority_decides_admission(stack: LocalStack) -> None:
    busy = hold_busy(stack)
    try:
        wait_for(lambda: epp_in_flight(stack.epp_http_url) == 1, what="the server busy")
        # the watched objective makes it sheddable: refused at once while full (asked
        # four times: with workers, Envoy spreads them over both); the busy stream is
        # open until closed below, so an answer now was not queued behind it
        for _ in range(4):
            status, body = complete(stack, "batch", 5, **{"x-gateway-inference-objective": "batch"})
            assert (status, body["error"]["code"]) == (429, "shed")
        # a critical one waits in its own band, then is served once the server is free
        with ThreadPoolExecutor(1) as pool_:
            critical = pool_.submit(
                complete, stack, "urgent", 5, **{"x-llm-d-inference-objective": "critical"}
            )
            wait_for(lambda: queues(stack) == [(5, 1)], what="the critical request held in band 5")
            assert not critical.done()
            busy.close()  # the client hangs up: the EPP frees the server
            assert critical.result(timeout=60)[0] == 200
    finally:
        busy.close()
