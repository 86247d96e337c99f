"""Fail-open through real Envoy: with the EPP killed (SIGKILL), every request still
reaches a model server by the fallback route; once the EPP is back on its port,
requests are routed by it again."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from epp_harness.envoyconfig import EnvoyOptions, epp_config
from epp_harness.envoyproc import EnvoyProcess, write_config
from epp_harness.procs import ManagedProcess, start_epp
from tests.support.http import metric_sum, request
from tests.support.sim import SimProc, sims
from tests.support.wait import quiesce_epps, wait_for

pytestmark = pytest.mark.e2e

BODY = orjson.dumps({"model": "sim-model", "prompt": "hello", "max_tokens": 2})


def _serve(tmp_path: Path, grpc_port: int, servers: list[SimProc]) -> ManagedProcess:
    return start_epp(
        tmp_path, "epp", "serve", "--grpc-port", str(grpc_port), "--http-port", "0",
        "--grpc-health-port", "0", "--log-level", "warning",
        "--decode", *(f"127.0.0.1:{s.port}" for s in servers),
    )  # fmt: skip


def _post(envoy: EnvoyProcess) -> tuple[int, str]:
    status, headers, body = request(f"http://127.0.0.1:{envoy.port}/v1/completions", BODY)
    return status, headers.get("x-sim-instance", "") or body.decode()[:300]


def _routed(epp: ManagedProcess) -> float:
    url = f"http://127.0.0.1:{epp.info['http_port']}"
    quiesce_epps([url])
    _, _, body = request(f"{url}/metrics")
    return metric_sum(body.decode(), 'epp_requests_total{outcome="routed"}')


@pytest.mark.parametrize("cluster", ["eds", "original-dst"])
def test_requests_survive_a_killed_epp_and_routing_resumes(tmp_path: Path, cluster: str) -> None:
    with sims(tmp_path, ["--time-scale", "0"], ["--time-scale", "0"]) as (a, b):
        servers = {f"127.0.0.1:{s.port}" for s in (a, b)}
        epp = _serve(tmp_path, 0, [a, b])
        grpc_port = int(epp.info["grpc_port"])
        opts = EnvoyOptions(
            listen_port=0, admin_port=0, epp_port=grpc_port, cluster=cluster,
            processing="buffered",
            failure_mode_allow=True,
            fallback_servers=(("127.0.0.1", a.port), ("127.0.0.1", b.port)),
        )  # fmt: skip
        envoy = EnvoyProcess(write_config(epp_config(opts), tmp_path / "envoy.yaml"), tmp_path)
        envoy.start()
        try:
            wait_for(lambda: _post(envoy)[0] == 200, what="a first answer")
            before = _routed(epp)
            assert all(_post(envoy) in {(200, s) for s in servers} for _ in range(5))
            assert _routed(epp) == before + 5  # routed by the EPP
            assert epp.proc is not None
            epp.proc.kill()
            epp.proc.wait(10)
            answers = [_post(envoy) for _ in range(20)]
            assert all(answer in {(200, s) for s in servers} for answer in answers), answers
            assert {s for _, s in answers} == servers  # round robin over both
            epp = _serve(tmp_path, grpc_port, [a, b])
            wait_for(lambda: _post(envoy)[0] == 200 and _routed(epp) > 0, what="routing again")
            resumed = _routed(epp)
            assert all(_post(envoy)[0] == 200 for _ in range(5))
            assert _routed(epp) == resumed + 5
        finally:
            envoy.stop()
            epp.stop()
