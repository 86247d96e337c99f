"""Prefill failover end to end: two prefill simulators, one decode simulator, real Envoy
and EPP (the `nixl` coordinator runs the prefill leg itself, `sidecar` leaves it to
`epp sidecar`). A prefill server killed under load costs no client error: the leg goes
to the other prefill server, and the decode server keeps receiving KV by transfer."""

from __future__ import annotations

import copy
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from epp.scheduling import defaults
from epp_harness.stack import LocalStack
from tests.e2e.conftest import ephemeral
from tests.support.http import get_json, metric_sum, request
from tests.support.load import Load
from tests.support.wait import wait_for

pytestmark = pytest.mark.e2e
PROMPT = "A long context that the decider always sends to a prefill server. " * 40
BODY = orjson.dumps({"model": "sim-model", "prompt": PROMPT, "max_tokens": 4})


def always_split(path: Path) -> Path:
    """The built-in config with the decider `always`: every request is disaggregated."""
    plugins = copy.deepcopy(list(defaults.PLUGINS))
    for plugin in plugins:
        if plugin["type"] == "pd-profile-handler":
            plugin.setdefault("parameters", {})["decider"] = "always"
    doc = {"plugins": plugins, "schedulingProfiles": list(defaults.PROFILES)}
    path.write_text(json.dumps(doc))  # JSON is YAML
    return path


@pytest.fixture(params=["nixl", "sidecar"])
def pd(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LocalStack]:
    opts = ephemeral(
        servers=0, prefill=2, decode=1, coordinator=request.param,
        sim_args=["--time-scale", "0.05"],
        epp_args=["--config", str(always_split(tmp_path / "always.yaml"))],
    )  # fmt: skip
    with LocalStack(opts) as s:
        yield s


def stats(stack: LocalStack, name: str) -> dict[str, Any]:
    i = next(i for i, p in enumerate(stack.sims) if p.name == name)
    doc: dict[str, Any] = get_json(f"{stack.sim_urls[i]}/sim/stats")
    return doc


def test_a_killed_prefill_server_costs_no_client_error(pd: LocalStack) -> None:
    status, _, body = request(f"{pd.envoy_url}/v1/completions", BODY)
    assert status == 200, body[:300]
    victim = next(p for p in pd.sims if p.name == "prefill-0")
    alone = stats(pd, "decode-0")["local_prefills"]
    with Load(f"{pd.envoy_url}/v1/completions", [BODY] * 4) as load:
        wait_for(lambda: stats(pd, "prefill-0")["prefill_legs"] >= 3, what="legs on prefill-0")
        os.kill(victim.pid, signal.SIGKILL)
        victim.proc.wait()  # type: ignore[union-attr]
        killed_at = len(load.results)
        legs = stats(pd, "prefill-1")["prefill_legs"]
        transfers = stats(pd, "decode-0")["kv_transfers"]
        wait_for(lambda: len(load.results) >= killed_at + 40, timeout=60, what="more traffic")
    print(f"pd failover ({pd.opts.coordinator}): {len(load.results)} requests, "
          f"{len(load.errors())} errors")  # fmt: skip
    assert load.errors() == []
    # the traffic moved to the other prefill server, and still arrives by transfer
    assert stats(pd, "prefill-1")["prefill_legs"] >= legs + 30
    assert stats(pd, "decode-0")["kv_transfers"] >= transfers + 30
    # no request decoded alone: every leg that met the dead server found the other one
    assert stats(pd, "decode-0")["local_prefills"] == alone
    # at least one leg met the dead server and went to the other one
    if pd.opts.coordinator == "sidecar":
        info = pd.sidecars[0].info
        assert get_json(f"http://{info['host']}:{info['port']}/sidecar/stats")["failovers"] >= 1
    else:
        text = request(f"{pd.epp_http_url}/metrics")[2].decode()
        failed = [
            line for line in text.splitlines()
            if line.startswith("epp_prefill_legs_total{") and 'outcome="failed"' in line
        ]  # fmt: skip
        assert failed and metric_sum("\n".join(failed), "epp_prefill_legs_total") >= 1
