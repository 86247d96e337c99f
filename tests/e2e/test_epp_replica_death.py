"""A dead EPP replica behind Envoy costs no new request: until Envoy's health checks take
it out of the ext_proc cluster, a stream Envoy cannot open on it is opened on another
replica (the ext_proc grpc_service's retry policy), not answered 503."""

from __future__ import annotations

import signal
from pathlib import Path

import orjson
import pytest

from epp_harness.envoyconfig import EnvoyOptions, epp_config
from epp_harness.envoyproc import EnvoyProcess, write_config
from epp_harness.procs import ManagedProcess, start_epp
from tests.support.http import request
from tests.support.sim import sims
from tests.support.wait import wait_for

pytestmark = pytest.mark.e2e

BODY = orjson.dumps({"model": "sim-model", "prompt": "hello", "max_tokens": 2})
# sent one by one right after the kill, before two failed health checks (0.5 s apart)
# can take the dead replica out: round robin sends about half of them its way
AFTER_KILL = 20


def _replica(tmp_path: Path, name: str, server: str) -> ManagedProcess:
    return start_epp(
        tmp_path,
        name,
        "serve",
        *("--grpc-port", "0", "--http-port", "0", "--grpc-health-port", "0"),
        *("--log-level", "warning", "--decode", server),
    )


def test_new_requests_go_to_the_live_replica_at_once(tmp_path: Path) -> None:
    with sims(tmp_path, ["--time-scale", "0"]) as (sim,):
        server = f"127.0.0.1:{sim.port}"
        live = _replica(tmp_path, "epp-0", server)
        doomed = _replica(tmp_path, "epp-1", server)
        opts = EnvoyOptions(
            listen_port=0,
            admin_port=0,
            epp_port=int(live.info["grpc_port"]),
            more_epps=(("127.0.0.1", int(doomed.info["grpc_port"])),),
        )
        envoy = EnvoyProcess(write_config(epp_config(opts), tmp_path / "envoy.yaml"), tmp_path)
        envoy.start()
        url = f"http://127.0.0.1:{envoy.port}/v1/completions"
        try:
            wait_for(lambda: request(url, BODY)[0] == 200, what="a first answer")
            assert doomed.proc is not None
            doomed.proc.send_signal(signal.SIGKILL)
            doomed.proc.wait()
            statuses = [request(url, BODY)[0] for _ in range(AFTER_KILL)]
            assert statuses == [200] * AFTER_KILL, statuses
        finally:
            envoy.stop()
            live.stop()
            doomed.stop()
