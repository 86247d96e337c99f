"""The argument lists the llm-d Router chart renders for its endpoint picker start this
EPP unchanged: the image's entry point (`epp`) gets them with no command, as the chart's
`args:` give them. Each list is checked for gRPC health on the health port (every
service the chart's probes ask for), /metrics on the metrics port and ext_proc on the
gRPC port (over TLS: the chart leaves --secure-serving at its default, true), with
discovery from a fake Kubernetes API (pool mode) or a label selector (standalone mode).

The lists: tests/support/llmd_chart.py; the one change from the chart's is the config
file's path (the chart mounts its ConfigMap at /config), a file holding the chart's own
default-plugins.yaml."""

from __future__ import annotations

import os
import socket
import ssl
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import orjson
import pytest
from envoy.service.ext_proc.v3.external_processor_pb2_grpc import ExternalProcessorStub
from grpc_health.v1 import health_pb2, health_pb2_grpc

from epp.common.health import EXT_PROC_SERVICE
from epp_harness.procs import ManagedProcess
from tests.support import extproc as m
from tests.support.http import request
from tests.support.kube_objects import pod, pool
from tests.support.kube_server import FakeKubeThread, write_kubeconfig
from tests.support.llmd_chart import DEFAULT_PLUGINS, chart_args
from tests.support.sim import SimProc, sims
from tests.support.wait import wait_for

SERVING = health_pb2.HealthCheckResponse.SERVING
# what the chart's probes ask for (one replica: inference-extension; more: liveness and
# readiness), and what Envoy's health checks of the ext_proc cluster ask for
PROBED = ("inference-extension", "liveness", "readiness", EXT_PROC_SERVICE, "")
CHART_PORTS = {"grpc": 9002, "grpc-health": 9003, "metrics": 9090}
CONFORMANCE = Path(__file__).resolve().parents[3] / "configs" / "conformance.yaml"


@pytest.fixture(scope="module")
def kube() -> Iterator[FakeKubeThread]:
    with FakeKubeThread().running() as k:
        yield k


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimProc]:
    with sims(tmp_path_factory.mktemp("sim"), []) as started:
        yield started[0]


@pytest.fixture(scope="module")
def cluster(
    kube: FakeKubeThread, sim: SimProc, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, str]:
    """The pool `qwen` (selecting app=qwen on the simulator's port) and one ready pod
    on 127.0.0.1; the environment the chart's pod gets (NAMESPACE) and the kubeconfig
    the client finds in place of a service account."""
    kube.call(lambda: kube.fake.apply("inferencepools", pool("qwen", target_ports=[sim.port])))
    kube.call(lambda: kube.fake.apply("pods", pod("qwen-0", "127.0.0.1")))
    workdir = tmp_path_factory.mktemp("chart")
    kubeconfig = write_kubeconfig(workdir / "kubeconfig", kube.url)
    env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
    return {**env, "KUBECONFIG": str(kubeconfig), "NAMESPACE": "default", "POD_NAME": "qwen-epp"}


def start(tmp_path: Path, env: dict[str, str], args: list[str]) -> ManagedProcess:
    """``epp ARGS`` (no command, as in the chart's container), logging to epp.log."""
    return ManagedProcess(
        "epp", [sys.executable, "-m", "epp", *args], log_path=tmp_path / "epp.log", env=env
    ).start()


def health(port: int, service: str) -> int:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=2)
    status: int = reply.status
    return status


def serving(proc: ManagedProcess, port: int) -> bool:
    assert proc.alive(), proc.log_tail()
    try:
        return health(port, "inference-extension") == SERVING
    except grpc.RpcError:
        return False


def routed_over_tls(port: int) -> str:
    """One ext_proc exchange on the gRPC port over TLS (trusting the certificate it
    serves, as gateways that skip verification do); the destination it picked."""
    pem = ssl.get_server_certificate(("127.0.0.1", port), timeout=5).encode()
    creds = grpc.ssl_channel_credentials(root_certificates=pem)
    body = orjson.dumps({"model": "sim-model", "prompt": "hello", "max_tokens": 2})
    with grpc.secure_channel(f"127.0.0.1:{port}", creds) as channel:
        replies = list(
            ExternalProcessorStub(channel).Process(
                iter([m.request_headers(), *m.chunked(body, 1)]), timeout=10
            )
        )
    return m.set_headers(replies[0])["x-gateway-destination-endpoint"]


def check_ports(proc: ManagedProcess, grpc_port: int, health_port: int, http_port: int) -> str:
    """Health, metrics and ext_proc where the chart expects them; the log's first line."""
    wait_for(lambda: serving(proc, health_port), timeout=30, what="health SERVING")
    for service in PROBED:
        assert health(health_port, service) == SERVING, service
    status, _, metrics = request(f"http://127.0.0.1:{http_port}/metrics")
    assert status == 200 and b"epp_endpoints" in metrics
    return routed_over_tls(grpc_port)


def ready_ports(proc: ManagedProcess, ready: Path) -> tuple[int, int, int]:
    proc.ready_file = ready
    info = proc.wait_ready()
    return info["grpc_port"], info["grpc_health_port"], info["http_port"]


@pytest.mark.parametrize("mode", ["pool", "standalone"])
def test_chart_args_on_free_ports(
    mode: str, cluster: dict[str, str], sim: SimProc, tmp_path: Path
) -> None:
    config = tmp_path / "default-plugins.yaml"
    config.write_text(DEFAULT_PLUGINS)
    args = (
        chart_args(config)
        if mode == "pool"
        else chart_args(config, selector="app=qwen", ports=str(sim.port))
    )
    ready = tmp_path / "epp.ready"
    overrides = ["--grpc-port", "0", "--metrics-port", "0", "--grpc-health-port", "0"]
    proc = start(tmp_path, cluster, [*args, *overrides, "--ready-file", str(ready)])
    try:
        grpc_port, health_port, http_port = ready_ports(proc, ready)
        assert check_ports(proc, grpc_port, health_port, http_port) == f"127.0.0.1:{sim.port}"
    finally:
        proc.stop()
    # --zap-encoder json: every line one JSON object
    lines = (tmp_path / "epp.log").read_text().splitlines()
    docs = [orjson.loads(line) for line in lines]
    assert docs and all({"time", "level", "logger", "message"} <= d.keys() for d in docs)
    assert any("TLS: self-signed" in d["message"] for d in docs)


def _ports_free() -> bool:
    for port in CHART_PORTS.values():
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                return False
    return True


def test_the_chart_literal_list_on_its_ports(
    cluster: dict[str, str], sim: SimProc, tmp_path: Path
) -> None:
    if not _ports_free():
        pytest.skip(f"the chart's ports {sorted(CHART_PORTS.values())} are not all free here")
    config = tmp_path / "default-plugins.yaml"
    config.write_text(DEFAULT_PLUGINS)
    proc = start(tmp_path, cluster, chart_args(config))
    try:
        chosen = check_ports(proc, 9002, 9003, 9090)
    finally:
        proc.stop()
    assert chosen == f"127.0.0.1:{sim.port}"


def test_the_conformance_suite_args(cluster: dict[str, str], sim: SimProc, tmp_path: Path) -> None:
    """The argument list the Inference Extension conformance suite's resources/base.yaml
    gives its EPP, plus configs/conformance.yaml as text (docs/llm-d-router.md) and free
    ports: health on its own port, ext_proc over TLS with the selection filter running."""
    ready = tmp_path / "epp.ready"
    args = [
        "--pool-name", "qwen", "--pool-namespace", "default", "--zap-encoder", "json",
        "--grpc-port", "0", "--grpc-health-port", "0",
        "--config-text", CONFORMANCE.read_text(),
        "--metrics-port", "0", "--ready-file", str(ready),
    ]  # fmt: skip
    proc = start(tmp_path, cluster, args)
    try:
        grpc_port, health_port, http_port = ready_ports(proc, ready)
        assert check_ports(proc, grpc_port, health_port, http_port) == f"127.0.0.1:{sim.port}"
    finally:
        proc.stop()
    log = (tmp_path / "epp.log").read_text()
    assert "endpoint-selection-header-filter" in log and "echoServedEndpoint: true" in log
