"""An EPP restarted with a new endpoint set behind a running Envoy: Envoy must never
route to an address the new EPP does not list, even while its EDS stream to the EPP is
still reconnecting (issue 14, item 8)."""

from __future__ import annotations

import urllib.request
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

BODY = orjson.dumps({"model": "sim-model", "prompt": "hello", "max_tokens": 2})
# what the EPP logs when it stops holding picks without an Envoy having acknowledged
# its endpoints (epp/xds/eds.py): Envoy's EDS stream was still in its reconnect backoff
GAVE_UP = "no Envoy acknowledged the EDS endpoints"


def _served(envoy: EnvoyProcess) -> tuple[int, str]:
    status, headers, _ = request(f"http://127.0.0.1:{envoy.port}/v1/completions", BODY)
    return status, headers.get("x-sim-instance", "")


def _connect_failures(envoy: EnvoyProcess) -> int:
    """Envoy's failed connection attempts to the EPP (each failed EDS reconnect is one)."""
    url = f"{envoy.admin_url}/stats?filter=^cluster\\.epp\\.upstream_cx_connect_fail$"
    with urllib.request.urlopen(url, timeout=5) as r:
        text: str = r.read().decode()
    return int(text.rsplit(":", 1)[1]) if ":" in text else 0


def _requests(sim: SimProc) -> int:
    count: int = sim.stats()["requests_total"]
    return count


def _serve(tmp_path: Path, grpc_port: int, servers: list[SimProc]) -> ManagedProcess:
    addresses = [f"127.0.0.1:{s.port}" for s in servers]
    return start_epp(
        tmp_path,
        "epp",
        "serve",
        *(
            "--grpc-port",
            str(grpc_port),
            "--http-port",
            "0",
            "--grpc-health-port",
            "0",
            "--log-level",
            "warning",
        ),
        *("--decode", *addresses),
    )


def test_a_restarted_epp_with_new_endpoints_is_followed_at_once(tmp_path: Path) -> None:
    with sims(tmp_path, *(["--time-scale", "0"] for _ in range(4))) as (a, b, c, d):
        old = {f"127.0.0.1:{s.port}" for s in (a, b)}
        new = {f"127.0.0.1:{s.port}" for s in (c, d)}
        epp = _serve(tmp_path, 0, [a, b])
        grpc_port = int(epp.info["grpc_port"])
        opts = EnvoyOptions(listen_port=0, admin_port=0, epp_port=grpc_port)
        envoy = EnvoyProcess(write_config(epp_config(opts), tmp_path / "envoy.yaml"), tmp_path)
        envoy.start()
        try:
            wait_for(lambda: _served(envoy) in {(200, x) for x in old}, what="A or B serving")
            epp.stop()
            # Let Envoy's EDS stream fail to reconnect a few times, so that it sits in
            # its reconnect backoff (which grows with each failure) when the EPP is back.
            wait_for(lambda: _connect_failures(envoy) >= 4, timeout=60, what="4 reconnects")
            before = _requests(a) + _requests(b)
            log = tmp_path / "epp.log"  # both EPPs append to it
            old_log = log.stat().st_size
            epp = _serve(tmp_path, grpc_port, [c, d])
            answers = []
            while len(answers) < 20:
                answers.append(_served(envoy))
                assert answers[-1][1] not in old, f"routed to a removed endpoint: {answers}"
            assert all(status == 200 and served in new for status, served in answers), answers
            # the first pick was released by Envoy's acknowledgement of the new endpoints
            # (its EDS stream back at once), not by the EPP giving up waiting for one
            new_log = log.read_text(errors="replace")[old_log:]
            assert GAVE_UP not in new_log, new_log
            assert _requests(a) + _requests(b) == before  # not even as a retry
        finally:
            envoy.stop()
            epp.stop()
