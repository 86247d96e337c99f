"""End to end with Kubernetes discovery: ``epp serve --pool-name`` (real process) reads a
loopback fake API server through a kubeconfig, and real Envoy routes real requests to
simulators registered there as pods (podIP 127.0.0.1, one port per simulator)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import partial

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from epp_harness.stack import LocalStack
from tests.e2e.conftest import ephemeral
from tests.support.http import get_json, request
from tests.support.kube_objects import pod, pool
from tests.support.kube_server import FakeKubeThread, write_kubeconfig
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
                  "--kubeconfig", str(kubeconfig), "--secure-serving=false"],
    )  # fmt: skip
    with LocalStack(opts) as s:
        yield s


def health(stack: LocalStack, service: str) -> int:
    with grpc.insecure_channel(f"127.0.0.1:{stack.grpc_port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        status: int = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status
        return status


def http_ready(stack: LocalStack) -> int:
    """``GET /ready`` on the HTTP port: what kubelet probes when gRPC runs over TLS."""
    return request(f"{stack.epp_http_url}/ready")[0]


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
    assert http_ready(stack) == 503
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
    assert http_ready(stack) == 200
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
    assert http_ready(stack) == 200

    # The pool itself deleted: not ready on both ports until it is back and listed.
    kube.call(lambda: kube.fake.delete("inferencepools", "default", "qwen-pool"))
    wait_for(lambda: health(stack, "readiness") == NOT_SERVING, what="readiness, pool gone")
    assert http_ready(stack) == 503
    kube.call(lambda: kube.fake.apply("inferencepools", pool(target_ports=ports)))
    wait_for(lambda: health(stack, "readiness") == SERVING, what="readiness, pool back")
    assert http_ready(stack) == 200


@pytest.fixture(scope="module")
def pd_stack(
    kube: FakeKubeThread, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalStack]:
    """One prefill and one decode simulator (NIXL) that the EPP learns only from pods."""
    workdir = tmp_path_factory.mktemp("kube-pd")
    kubeconfig = write_kubeconfig(workdir / "kubeconfig", kube.url)
    opts = ephemeral(
        servers=0, prefill=1, decode=1, coordinator="nixl", static_endpoints=False,
        workdir=workdir, sim_args=["--time-scale", "0.05"],
        epp_args=["--pool-name", "pd-pool", "--kubeconfig", str(kubeconfig),
                  "--secure-serving=false"],
    )  # fmt: skip
    with LocalStack(opts) as s:
        yield s


def test_roles_from_pod_metadata_drive_prefill_decode(
    kube: FakeKubeThread, pd_stack: LocalStack
) -> None:
    by_name = {p.name: a for p, a in zip(pd_stack.sims, pd_stack.sim_addresses, strict=True)}
    prefill_port = int(by_name["prefill-0"].rsplit(":", 1)[1])
    decode_port = int(by_name["decode-0"].rsplit(":", 1)[1])
    labels = {"app": "pd"}
    # prefill role from a port-discovery attribute, decode role from the llm-d.ai/role label
    prefill_pod = pod(
        "prefill",
        "127.0.0.1",
        labels=labels,
        port_discovery=[
            {"inferencePool": "pd-pool", "number": prefill_port, "attributes": {"role": "prefill"}}
        ],
    )
    decode_pod = pod("decode", "127.0.0.1", labels={**labels, "llm-d.ai/role": "decode"})
    pd_pool = pool("pd-pool", match_labels=labels, target_ports=[decode_port])
    for resource, obj in (("pods", prefill_pod), ("pods", decode_pod), ("inferencepools", pd_pool)):
        kube.call(partial(kube.fake.apply, resource, obj))
    wait_for(lambda: endpoints(pd_stack) == 2, what="both pods discovered")

    def legs() -> tuple[int, int]:
        stats = [get_json(f"{url}/sim/stats") for url in pd_stack.sim_urls]
        by = {p.name: s for p, s in zip(pd_stack.sims, stats, strict=True)}
        return by["prefill-0"]["prefill_legs"], by["decode-0"]["requests_total"]

    before_prefill, before_decode = legs()
    prompt = "kubernetes pd: " + "Background for the question that follows. " * 60
    body = json.dumps({"model": "sim-model", "prompt": prompt, "max_tokens": 4}).encode()
    status, _, reply = request(f"{pd_stack.envoy_url}/v1/completions", body)
    assert status == 200, reply[:300]
    assert legs() == (before_prefill + 1, before_decode + 1)
