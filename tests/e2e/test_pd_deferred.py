"""Deferred decode selection end to end (`disaggregation.deferDecode`), for the
coordinators that can defer (`nixl`, `kv-pool`): real Envoy and EPP, one prefill
simulator whose prefill is slowed to seconds, two decode simulators. While a request's
prefill leg runs, no decode endpoint holds it; one decode server then becomes full (its
queue past the EPP's threshold, from requests sent to it directly); the decode pick made
when the leg ends avoids that server, the response is right, and the EPP's accounting is
back to zero."""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from epp.scheduling import defaults
from epp_harness.stack import LocalStack
from tests.e2e.conftest import ephemeral
from tests.support.http import get_json, metric_sum, request
from tests.support.wait import wait_for

pytestmark = pytest.mark.e2e
MODEL = "sim-model"
# ~650 simulated tokens at 6 ms each: a prefill of ~4 s (the window the test acts in)
PROMPT = "Background for the question that follows. " * 60
SIM_ARGS = ["--max-num-seqs", "2", "--prefill-ms-per-token", "6"]
FLOOD = 8  # requests sent straight to one decode server: 2 running, 6 waiting (>= 5)


def deferring_config(path: Path) -> Path:
    """The built-in config with the decider `always` and deferDecode on."""
    plugins = copy.deepcopy(list(defaults.PLUGINS))
    for plugin in plugins:
        if plugin["type"] == "pd-profile-handler":
            plugin.setdefault("parameters", {})["decider"] = "always"
    doc = {
        "plugins": plugins,
        "schedulingProfiles": list(defaults.PROFILES),
        "disaggregation": {"deferDecode": True},
    }
    path.write_text(json.dumps(doc))  # JSON is YAML
    return path


@pytest.fixture(params=["nixl", "kv-pool"])
def pd(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LocalStack]:
    opts = ephemeral(
        servers=0, prefill=1, decode=2, coordinator=request.param, sim_args=SIM_ARGS,
        epp_args=["--config", str(deferring_config(tmp_path / "defer.yaml"))],
    )  # fmt: skip
    with LocalStack(opts) as s:
        yield s


def sim_index(stack: LocalStack, name: str) -> int:
    return next(i for i, p in enumerate(stack.sims) if p.name == name)


def stats(stack: LocalStack, name: str) -> dict[str, Any]:
    doc: dict[str, Any] = get_json(f"{stack.sim_urls[sim_index(stack, name)]}/sim/stats")
    return doc


def epp_metric(stack: LocalStack, name: str) -> float:
    _, _, text = request(f"{stack.epp_http_url}/metrics")
    return metric_sum(text.decode(), name)


def in_background(url: str, doc: dict[str, Any], out: list[Any]) -> threading.Thread:
    def send() -> None:
        try:
            out.append(request(url, orjson.dumps(doc), timeout=60))
        except OSError as exc:  # the flood, cut short when the stack stops
            out.append(exc)

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


def test_the_decode_pick_after_the_prefill_avoids_a_server_that_filled_meanwhile(
    pd: LocalStack,
) -> None:
    busy, idle = "decode-0", "decode-1"
    busy_address = pd.sim_addresses[sim_index(pd, busy)]
    idle_address = pd.sim_addresses[sim_index(pd, idle)]
    before = stats(pd, idle)
    doc = {"model": MODEL, "prompt": f"deferred: {PROMPT}", "max_tokens": 6}
    answer: list[Any] = []
    client = in_background(f"{pd.envoy_url}/v1/completions", doc, answer)
    # the prefill leg runs: the request waits on no decode endpoint
    wait_for(lambda: epp_metric(pd, "epp_pending_decode_requests") == 1, what="the prefill leg")
    assert epp_metric(pd, f'epp_in_flight_requests{{endpoint="{busy_address}"}}') == 0
    assert epp_metric(pd, f'epp_in_flight_requests{{endpoint="{idle_address}"}}') == 0
    # now one decode server fills up behind the EPP's back
    flood: list[Any] = []
    busy_url = pd.sim_urls[sim_index(pd, busy)]
    for i in range(FLOOD):
        in_background(
            f"{busy_url}/v1/completions",
            {"model": MODEL, "prompt": f"busy {i}", "max_tokens": 3000},
            flood,
        )
    queue = f'epp_endpoint_queue_depth{{endpoint="{busy_address}"}}'
    wait_for(lambda: epp_metric(pd, queue) >= 5, what="the EPP seeing the full decode server")
    assert epp_metric(pd, "epp_pending_decode_requests") == 1, (
        "the prefill leg ended before the decode server filled up (machine too slow?)"
    )
    client.join(timeout=30)
    [(status, headers, body)] = answer
    assert status == 200, body[:300]
    assert headers.get("x-sim-instance") == idle_address  # not the full one
    usage = orjson.loads(body)["usage"]
    assert usage["completion_tokens"] == 6
    assert usage["prompt_tokens_details"]["cached_tokens"] > 0  # not computed there
    after = stats(pd, idle)
    assert after["kv_transfers"] == before["kv_transfers"] + 1  # its KV came from the leg
    assert after["local_prefills"] == before["local_prefills"]
    assert stats(pd, "prefill-0")["prefill_legs"] == 1
    picks = (
        'epp_deferred_decode_picks_total{pick="same"}',
        ('epp_deferred_decode_picks_total{pick="moved"}'),
    )
    assert sum(epp_metric(pd, name) for name in picks) == 1
    # the EPP's accounting is back to zero (the flood never passed the EPP)
    wait_for(
        lambda: (
            epp_metric(pd, "epp_in_flight_requests") == 0
            and epp_metric(pd, "epp_pending_decode_requests") == 0
        ),
        what="in-flight accounting back to zero",
    )
