"""The EPP's counters tell faults apart, through the real Envoy: a client that hangs up
mid-stream is `abandoned`, not `complete`; requests without a body (GET /, GET
/v1/models) are forwarded, not counted as scheduling decisions."""

from __future__ import annotations

import orjson
import pytest

from epp_harness.stack import LocalStack
from tests.support.http import metric_samples, open_raw_post, request
from tests.support.wait import wait_for

pytestmark = pytest.mark.e2e


def counters(stack: LocalStack) -> dict[str, float]:
    return metric_samples(f"{stack.epp_http_url}/metrics")


def delta(before: dict[str, float], after: dict[str, float], prefix: str) -> dict[str, float]:
    changed = {k: after[k] - before.get(k, 0.0) for k in after if k.startswith(prefix)}
    return {k: v for k, v in changed.items() if v}


def test_requests_without_a_body_are_not_scheduling_decisions(stack: LocalStack) -> None:
    before = counters(stack)
    assert request(f"{stack.envoy_url}/")[0] == 404
    assert request(f"{stack.envoy_url}/v1/models")[0] == 200
    after = counters(stack)
    assert delta(before, after, "epp_requests_total") == {
        'epp_requests_total{outcome="forwarded"}': 2.0
    }
    assert delta(before, after, "epp_scheduling_duration_seconds_count") == {}
    assert delta(before, after, "epp_pd_decisions_total") == {}


def test_a_client_hanging_up_mid_stream_is_counted_as_abandoned(stack: LocalStack) -> None:
    body = orjson.dumps(
        {"model": "sim-model", "prompt": "hang up", "max_tokens": 500, "stream": True}
    )
    before = counters(stack)
    with open_raw_post(stack.envoy_url, "/v1/completions", body) as sock:
        got = b""
        while b"data:" not in got:
            got += sock.recv(65536)
    abandoned = 'epp_extproc_streams_total{end="abandoned"}'
    wait_for(
        lambda: delta(before, counters(stack), abandoned),
        what="the hang-up counted as abandoned",
    )
    ends = delta(before, counters(stack), "epp_extproc_streams_total")
    assert ends == {abandoned: 1.0}
