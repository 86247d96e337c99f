"""The EPP's counters tell faults apart, through the real Envoy: a client that hangs up
mid-stream is `abandoned`, not `complete`; requests without a body (GET /, GET
/v1/models) are forwarded, not counted as scheduling decisions."""

from __future__ import annotations

import contextlib

import orjson
import pytest

from epp_harness.stack import LocalStack
from tests.support.http import metric_samples, open_raw_post, request
from tests.support.wait import quiesce, wait_for

pytestmark = pytest.mark.e2e


def counters(stack: LocalStack) -> dict[str, float]:
    """The EPP's samples once it has counted everything (earlier tests' streams end,
    and are counted, when Envoy closes them: after their clients had the answer)."""
    quiesce(stack)
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
    # counters() waits for the stream to end: then it is counted, and only it
    ends = delta(before, counters(stack), "epp_extproc_streams_total")
    assert ends == {'epp_extproc_streams_total{end="abandoned"}': 1.0}


def open_streams(stack: LocalStack) -> float:
    samples = metric_samples(f"{stack.epp_http_url}/metrics", "epp_extproc_open_streams")
    assert "epp_extproc_open_streams" in samples, "the EPP exports no open-streams gauge"
    return samples["epp_extproc_open_streams"]


def test_open_streams_count_each_stream_from_its_request_to_its_end(stack: LocalStack) -> None:
    """epp_extproc_open_streams: up while Envoy holds a request's stream open (a
    response still streaming), down as each ends: a client hanging up, a request
    answered, one rejected; 0 at rest."""
    body = orjson.dumps(
        {"model": "sim-model", "prompt": "hold on", "max_tokens": 2000, "stream": True}
    )
    quiesce(stack)
    assert open_streams(stack) == 0
    with contextlib.ExitStack() as held:
        for n in (1, 2):
            sock = held.enter_context(open_raw_post(stack.envoy_url, "/v1/completions", body))
            assert b"200 OK" in sock.recv(4096)  # its response streams: its stream is open
            assert open_streams(stack) == n
        sock.close()  # the client hangs up: Envoy ends that stream
        wait_for(lambda: open_streams(stack) == 1, what="the abandoned stream closed")
        answered = orjson.dumps({"model": "sim-model", "prompt": "short", "max_tokens": 2})
        assert request(f"{stack.envoy_url}/v1/completions", answered)[0] == 200
        assert request(f"{stack.envoy_url}/v1/completions", b"{not json")[0] == 400
        wait_for(lambda: open_streams(stack) == 1, what="the answered and rejected streams closed")
    quiesce(stack)  # the last client gone: every stream ended, the gauge back to 0
    assert open_streams(stack) == 0
