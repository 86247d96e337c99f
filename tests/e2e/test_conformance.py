"""The Gateway API Inference Extension conformance suite's EPP-facing scenarios, through
a real Envoy, this EPP with configs/conformance.yaml and real simulators, without a
cluster. Two "pods": 127.0.0.1 serves three data-parallel ranks (three simulators on
their own ports, as the suite's target ports 3000/3002/3004 of one pod), 127.0.0.2 one.

* following the EPP's pick: the header names one endpoint, every request goes there;
* data parallelism: a bare IP selects every rank of that pod, IP:port one rank;
* the served endpoint comes back in x-conformance-test-served-endpoint;
* a header that names no endpoint leaves every endpoint a candidate;
* fail-open: with the EPP gone, requests still reach a model server (Envoy's
  failure_mode_allow), the suite's EppUnAvailableFailOpen.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest

from epp_harness.envoyconfig import EnvoyOptions, epp_config
from epp_harness.envoyproc import EnvoyProcess, write_config
from epp_harness.procs import ManagedProcess, start_epp
from tests.support.http import request
from tests.support.sim import SimProc, sims
from tests.support.wait import wait_for

pytestmark = pytest.mark.e2e

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "conformance.yaml"
MODEL = "conformance-fake-model"  # the suite's
BODY = orjson.dumps({"model": MODEL, "prompt": "San Francisco"})
SELECTION = "test-epp-endpoint-selection"
ECHO = "x-conformance-test-served-endpoint"
# enough requests that a pick spread over n endpoints misses one with odds below 1e-30
ENOUGH = 300


@dataclass
class Stack:
    envoy: EnvoyProcess
    epp: ManagedProcess
    ranks: list[str]  # pod 127.0.0.1's endpoints
    other: str  # pod 127.0.0.2's endpoint

    def post(self, selection: str | None = None) -> tuple[str, str]:
        """One request: the endpoint that answered (the simulator's own word), and the
        echoed served endpoint."""
        headers = {} if selection is None else {SELECTION: selection}
        url = f"http://127.0.0.1:{self.envoy.port}/v1/completions"
        status, got, body = request(url, BODY, headers)
        assert status == 200, body[:300]
        return got["x-sim-instance"], got.get(ECHO, "")

    def served(self, selection: str | None, n: int = 20) -> set[str]:
        return {self.post(selection)[0] for _ in range(n)}

    def spread(self, selection: str | None, expected: set[str]) -> set[str]:
        """The endpoints that answered, requests sent until ``expected`` did (or
        ENOUGH of them were sent)."""
        seen: set[str] = set()
        for _ in range(ENOUGH):
            seen.add(self.post(selection)[0])
            if seen >= expected:
                break
        return seen


def _addresses(servers: list[SimProc]) -> list[str]:
    return [s.url.removeprefix("http://") for s in servers]


def _envoy(tmp_path: Path, epp: ManagedProcess, fallback: list[str]) -> EnvoyProcess:
    opts = EnvoyOptions(
        listen_port=0, admin_port=0, epp_port=int(epp.info["grpc_port"]),
        processing="buffered", failure_mode_allow=True,
        fallback_servers=tuple((a.rsplit(":", 1)[0], int(a.rsplit(":", 1)[1])) for a in fallback),
    )  # fmt: skip
    envoy = EnvoyProcess(write_config(epp_config(opts), tmp_path / "envoy.yaml"), tmp_path)
    envoy.start()
    return envoy


@contextmanager
def _stack(tmp_path: Path) -> Iterator[Stack]:
    fast = ["--time-scale", "0", "--model", MODEL]
    pod_b = [*fast, "--host", "127.0.0.2"]
    with sims(tmp_path, fast, fast, fast, pod_b) as servers:
        addresses = _addresses(servers)
        epp = start_epp(
            tmp_path, "epp", "serve", "--grpc-port", "0", "--http-port", "0",
            "--grpc-health-port", "0", "--log-level", "warning", "--config", str(CONFIG),
            "--decode", *addresses,
        )  # fmt: skip
        envoy = None
        try:
            envoy = _envoy(tmp_path, epp, addresses)
            stack = Stack(envoy, epp, addresses[:3], addresses[3])
            wait_for(lambda: _answers(stack), what="a first answer through Envoy")
            yield stack
        finally:
            if envoy is not None:
                envoy.stop()
            epp.stop()


def _answers(stack: Stack) -> bool:
    url = f"http://127.0.0.1:{stack.envoy.port}/v1/completions"
    return request(url, BODY)[0] == 200


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with _stack(tmp_path_factory.mktemp("conformance")) as s:
        yield s


def test_every_request_goes_where_the_header_points(stack: Stack) -> None:
    """The suite's GatewayFollowingEPPRouting: the header names one pod by its IP."""
    assert stack.served(stack.other.split(":")[0]) == {stack.other}
    for rank in stack.ranks:
        assert stack.served(rank) == {rank}


def test_a_bare_ip_selects_every_rank_of_its_pod(stack: Stack) -> None:
    """The suite's data-parallel variant: a bare IP lets the EPP balance over every
    target port of that pod, and no other pod."""
    ranks = set(stack.ranks)
    assert stack.spread("127.0.0.1", ranks) == ranks


def test_ip_and_port_tokens_select_single_ranks(stack: Stack) -> None:
    first, second, third = stack.ranks
    assert stack.served(second) == {second}
    allowed = {first, third}
    assert stack.spread(f"{first},{third}", allowed) == allowed
    # one pod by IP (any rank), another pinned to one rank
    mixed = f"127.0.0.2,{third}"
    assert stack.spread(mixed, {stack.other, third}) == {stack.other, third}


def test_the_served_endpoint_is_echoed(stack: Stack) -> None:
    """The suite's GatewayDestinationEndpointServed: the response names the endpoint
    that answered."""
    for endpoint in [*stack.ranks, stack.other]:
        assert stack.post(endpoint) == (endpoint, endpoint)
    answered, echoed = stack.post()
    assert echoed == answered


@pytest.mark.parametrize("selection", ["10.9.9.9", "127.0.0.1:1,garbage", " , "])
def test_a_header_that_names_no_endpoint_leaves_every_candidate(
    stack: Stack, selection: str
) -> None:
    everyone = {*stack.ranks, stack.other}
    assert stack.spread(selection, everyone) == everyone


def test_requests_go_on_when_the_epp_is_gone(tmp_path: Path) -> None:
    """The suite's EppUnAvailableFailOpen: with the EPP up, the header is followed; with
    it gone, requests still reach a model server, unrouted (and nothing is echoed)."""
    with _stack(tmp_path) as stack:
        everyone = {*stack.ranks, stack.other}
        assert stack.served("127.0.0.2") == {stack.other}
        assert stack.epp.proc is not None
        stack.epp.proc.kill()
        stack.epp.proc.wait(10)
        answers = [stack.post("127.0.0.2") for _ in range(20)]
        assert {echo for _, echo in answers} == {""}
        # Envoy's round robin over the fallback servers, not the header's pick
        assert {served for served, _ in answers} <= everyone
        assert len({served for served, _ in answers}) > 1
