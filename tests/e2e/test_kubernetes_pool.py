"""End to end with Kubernetes discovery: ``epp serve --pool-name`` (real process) reads a
loopback fake API server through a kubeconfig, and real Envoy routes real requests to
simulators registered there as pods (podIP 127.0.0.1, one port per simulator)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from epp.stack import LocalStack
from tests.e2e.conftest import ephemeral
from tests.support.fake_kube import FakeKubeThread, write_kubeconfig
from tests.support.http import get_json, request
from tests.support.kube_objects import pod, pool
from tests.support.wait import wait_for

pytestmark = pytest.mark.e2e
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@pytest.fixture(scope="module")
def kube() -> Iterator[FakeKubeThread]:
    with FakeKubeThread().running() as k:
        yield k


@pytest.fixture(scope="module")
def stack(kube: FakeKubeThread, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    workdir = tmp_path_factory.mktemp("kube")
    kubeconfig = write_kubeconfig(workdir / "kubeconfig", kube.url)
    opts = ephemeral(
        servers=3,
        workdir=workdir,
        static_endpoints=False,
        epp_args=["--pool-name", "qwen-pool", "--pool-namespace", "default",
                  "--kubeconfig", str(kubeconfig)],
    )  # fmt: skip
    with LocalStack(opts) as s:
        yield s


def health(stack: LocalStack, service: str) -> int:
    with grpc.insecure_channel(f"127.0.0.1:{stack.grpc_port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        status: int = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status
        return status


def complete(stack: LocalStack) -> tuple[int, bytes]:
    body = json.dumps({"model": "sim-model", "prompt": "hello", "max_tokens": 2}).encode()
    status, _, reply = request(f"{stack.envoy_url}/v1/completions", body)
    return status, reply


def served(stack: LocalStack) -> list[int]:
    return [get_json(f"{url}/sim/stats")["requests_total"] for url in stack.sim_urls]


def endpoints(stack: LocalStack) -> int:
    count: int = get_json(f"{stack.epp_http_url}/health")["endpoints"]
    return count


def test_routes_to_pods_of_the_pool_and_follows_them(
    kube: FakeKubeThread, stack: LocalStack
) -> None:
    ports = [int(a.rsplit(":", 1)[1]) for a in stack.sim_addresses]
    # No pool yet: alive, not ready, and requests get the EPP's 503.
    assert health(stack, "liveness") == SERVING
    assert health(stack, "readiness") == NOT_SERVING
    status, reply = complete(stack)
    assert status == 503 and json.loads(reply)["error"]["code"] == "no_endpoint"

    # Pod a serves the pool's targetPorts narrowed by active-ports (sim 0 only); pod b
    # declares sims 1 and 2 through the port-discovery annotation.
    pod_a = pod(
        "a", "127.0.0.1", annotations={"inference.networking.k8s.io/active-ports": str(ports[0])}
    )
    pod_b = pod("b", "127.0.0.1", port_discovery=[
        {"inferencePool": "qwen-pool", "number": ports[1], "attributes": {"role": "decode"}},
        {"inferencePool": "qwen-pool", "number": ports[2]},
    ])  # fmt: skip
    kube.call(lambda: kube.fake.apply("pods", pod_a))
    kube.call(lambda: kube.fake.apply("pods", pod_b))
    kube.call(lambda: kube.fake.apply("inferencepools", pool(target_ports=ports)))
    wait_for(lambda: health(stack, "readiness") == SERVING, what="readiness after first sync")
    assert endpoints(stack) == 3

    before = served(stack)
    for _ in range(30):
        status, reply = complete(stack)
        assert status == 200, reply
    after = served(stack)
    assert all(b > a for a, b in zip(before, after, strict=True)), (before, after)

    # Pod b turns unready: its two servers drain out and get no new requests.
    kube.call(lambda: kube.fake.apply("pods", pod("b", "127.0.0.1", ready=False)))
    wait_for(lambda: endpoints(stack) == 1, what="pod b's endpoints gone")
    before = served(stack)
    for _ in range(10):
        assert complete(stack)[0] == 200
    after = served(stack)
    assert after[0] == before[0] + 10 and after[1:] == before[1:]

    # Pod a deleted: nothing left to route to, the EPP says so.
    kube.call(lambda: kube.fake.delete("pods", "default", "a"))
    wait_for(lambda: endpoints(stack) == 0, what="pod a deleted")
    assert complete(stack)[0] == 503
    assert health(stack, "readiness") == SERVING  # synced once; an empty pool is still known
