"""Prefill/decode disaggregation end to end, for every coordinator: real Envoy, the EPP,
one prefill and one decode simulator speaking the coordinator's KV-transfer protocol
(and, for `sidecar`, our `epp sidecar` in front of the decode server)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from epp_harness.stack import SIM_CONNECTOR, LocalStack
from tests.e2e.conftest import ephemeral
from tests.support.http import get_json, metric_sum, request
from tests.support.wait import quiesce, wait_for

pytestmark = pytest.mark.e2e
MODEL = "sim-model"
LONG = "Background for the question that follows. " * 60  # ~650 tokens: disaggregated
SHORT = "Hi there"  # far below nonCachedTokens: decode only


@pytest.fixture(scope="module", params=sorted(SIM_CONNECTOR))
def pd(request: pytest.FixtureRequest) -> Iterator[LocalStack]:
    opts = ephemeral(
        servers=0, prefill=1, decode=1, coordinator=request.param,
        sim_args=["--time-scale", "0.05"],
    )  # fmt: skip
    with LocalStack(opts) as s:
        yield s


def sim_stats(stack: LocalStack, name: str) -> dict[str, Any]:
    """/sim/stats of the simulator named e.g. "prefill-0"."""
    i = next(i for i, p in enumerate(stack.sims) if p.name == name)
    stats: dict[str, Any] = get_json(f"{stack.sim_urls[i]}/sim/stats")
    return stats


def last_request(stack: LocalStack, name: str) -> dict[str, Any]:
    i = next(i for i, p in enumerate(stack.sims) if p.name == name)
    doc: dict[str, Any] = get_json(f"{stack.sim_urls[i]}/sim/last-request")
    return doc


def post(stack: LocalStack, path: str, doc: dict[str, Any], rid: str) -> tuple[int, bytes]:
    status, _, body = request(
        f"{stack.envoy_url}{path}", orjson.dumps(doc), headers={"x-request-id": rid}
    )
    return status, body


def counters(stack: LocalStack) -> tuple[dict[str, Any], dict[str, Any]]:
    return sim_stats(stack, "prefill-0"), sim_stats(stack, "decode-0")


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_long_prompt_is_prefilled_elsewhere_and_not_recomputed(
    pd: LocalStack, path: str, stream: bool
) -> None:
    before_p, before_d = counters(pd)
    rid = f"pd-{pd.opts.coordinator}-{path.strip('/').replace('/', '-')}-{stream}"
    doc: dict[str, Any] = {"model": MODEL, "max_tokens": 7, "stream": stream}
    prompt = f"{rid}: {LONG}"  # new to every server, so the decider disaggregates
    if path.endswith("chat/completions"):
        doc["messages"] = [{"role": "user", "content": prompt}]
    else:
        doc["prompt"] = prompt
    if stream:
        doc["stream_options"] = {"include_usage": True}
    status, body = post(pd, path, doc, rid)
    assert status == 200, body[:300]
    if stream:
        assert body.rstrip().endswith(b"data: [DONE]")
    # (concurrent: the prefill leg may finish just after the decode leg)
    wait_for(
        lambda: sim_stats(pd, "prefill-0")["prefill_legs"] == before_p["prefill_legs"] + 1,
        what="the prefill leg",
    )
    after_d = sim_stats(pd, "decode-0")
    assert after_d["kv_transfers"] == before_d["kv_transfers"] + 1
    assert after_d["recomputed_prefills"] == before_d["recomputed_prefills"]
    assert after_d["local_prefills"] == before_d["local_prefills"]
    # the client's own limits and stream flag reach the decode server; both legs share
    # the request id
    decoded = last_request(pd, "decode-0")
    assert decoded["body"]["max_tokens"] == 7
    assert decoded["body"]["stream"] is stream
    assert decoded["headers"].get("x-request-id") == rid
    assert last_request(pd, "prefill-0")["headers"].get("x-request-id") == rid


def test_short_prompt_goes_decode_only(pd: LocalStack) -> None:
    before_p, before_d = counters(pd)
    status, body = post(
        pd, "/v1/completions", {"model": MODEL, "prompt": SHORT, "max_tokens": 3}, "short"
    )
    assert status == 200, body[:300]
    after_p, after_d = counters(pd)
    assert after_p["prefill_legs"] == before_p["prefill_legs"]
    assert after_d["local_prefills"] == before_d["local_prefills"] + 1
    _, _, metrics = request(f"{pd.epp_http_url}/metrics")
    text = metrics.decode()
    assert metric_sum(text, 'epp_pd_decisions_total{decision="decode-only"}') >= 1
    assert metric_sum(text, 'epp_pd_decisions_total{decision="disaggregated"}') >= 1


def epp_metric(stack: LocalStack, name: str) -> float:
    quiesce(stack)
    _, _, text = request(f"{stack.epp_http_url}/metrics")
    return metric_sum(text.decode(), name)


def test_client_error_from_the_prefill_server_reaches_the_client(pd: LocalStack) -> None:
    coordinator = pd.opts.coordinator
    decode_before = sim_stats(pd, "decode-0")["requests_total"]
    doc = {"model": "no-such-model", "prompt": "4xx: " + LONG}
    status, body = post(pd, "/v1/completions", doc, "bad")
    assert status == 404, body[:300]
    assert "no-such-model" in orjson.loads(body)["error"]["message"]
    if coordinator in ("nixl", "kv-pool"):  # the EPP's prefill leg got the 404
        rejected = f'epp_prefill_legs_total{{coordinator="{coordinator}",outcome="rejected"}}'
        assert epp_metric(pd, rejected) == 1
    if coordinator != "concurrent":  # (concurrent: decode gets the same body at once)
        assert sim_stats(pd, "decode-0")["requests_total"] == decode_before


def test_both_legs_carry_the_same_request_id_and_credentials(pd: LocalStack) -> None:
    doc = {"model": MODEL, "prompt": "ids: " + LONG, "max_tokens": 2}
    status, _, body = request(  # no x-request-id from the client: Envoy's or ours is used
        f"{pd.envoy_url}/v1/completions", orjson.dumps(doc), {"authorization": "Bearer k1"}
    )
    assert status == 200, body[:300]
    prefill_seen = wait_for(
        lambda: (r := last_request(pd, "prefill-0"))["body"]["prompt"] == doc["prompt"] and r,
        what="the prefill leg",
    )
    decode_seen = last_request(pd, "decode-0")
    rid = decode_seen["headers"].get("x-request-id")
    assert rid and prefill_seen["headers"].get("x-request-id") == rid
    assert prefill_seen["headers"].get("authorization") == "Bearer k1"


def test_dead_prefill_server_falls_back_to_decode_alone(pd: LocalStack) -> None:
    """Runs last in this module: it stops the prefill simulator."""
    coordinator = pd.opts.coordinator
    pd.sims[0].stop()
    assert pd.sims[0].name == "prefill-0"
    before = sim_stats(pd, "decode-0")
    gave_up = (  # tried the leg and gave up, or already knew the server was gone
        f'epp_prefill_legs_total{{coordinator="{coordinator}",outcome="failed"}}',
        'epp_pd_decisions_total{decision="no-prefill-endpoint"}',
    )
    gave_up_before = sum(epp_metric(pd, name) for name in gave_up)
    for i in range(3):
        prompt = f"never seen before {i}: " + LONG  # so the decider disaggregates
        doc = {"model": MODEL, "prompt": prompt, "max_tokens": 3}
        status, body = post(pd, "/v1/completions", doc, f"dead-{i}")
        assert status == 200, body[:300]
        assert "bootstrap_room" not in last_request(pd, "decode-0")["body"]
    after = sim_stats(pd, "decode-0")
    prefilled_here = (after["local_prefills"] + after["recomputed_prefills"]) - (
        before["local_prefills"] + before["recomputed_prefills"]
    )
    assert prefilled_here == 3
    assert after["kv_transfers"] == before["kv_transfers"]
    if coordinator != "sidecar":  # (the sidecar's own fallback is invisible to the EPP)
        assert sum(epp_metric(pd, name) for name in gave_up) - gave_up_before == 3


def test_buffered_processing_replaces_the_body_for_the_decode_leg() -> None:
    """In BUFFERED mode Envoy holds the body; the rewritten decode body goes back as a
    body mutation (not streamed chunks) and still reaches the decode server whole."""
    opts = ephemeral(
        servers=0, prefill=1, decode=1, coordinator="nixl", processing="buffered",
        sim_args=["--time-scale", "0.05"],
    )  # fmt: skip
    with LocalStack(opts) as stack:
        doc = {"model": MODEL, "prompt": "buffered: " + LONG, "max_tokens": 4}
        status, body = post(stack, "/v1/completions", doc, "buffered-1")
        assert status == 200, body[:300]
        decode = sim_stats(stack, "decode-0")
        assert (decode["kv_transfers"], decode["recomputed_prefills"]) == (1, 0)
        received = last_request(stack, "decode-0")["body"]
        assert received["kv_transfer_params"]["do_remote_prefill"] is True
        assert received["prompt"] == doc["prompt"]
