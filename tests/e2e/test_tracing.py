"""Traces end to end: ``epp serve --tracing`` behind a real Envoy exports its spans over
OTLP/HTTP to a real receiver (tests/support/otlp.py), continues the client's W3C trace,
and the model server that answers (and a prefill server) receives a ``traceparent`` of
the same trace, naming the EPP's span."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from epp_harness.stack import LocalStack
from tests.e2e.conftest import ephemeral
from tests.support.http import get_json, request
from tests.support.otlp import OtlpReceiver, ReceivedSpan
from tests.support.wait import wait_for

pytestmark = pytest.mark.e2e
MODEL = "sim-model"
CLIENT_SPAN = "00f067aa0ba902b7"
ERROR = 2  # OTLP status code


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver().running() as r:
        yield r


def otel_env(receiver: OtlpReceiver) -> dict[str, str]:
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_SERVICE_NAME": "epp-e2e",
        "OTEL_BSP_SCHEDULE_DELAY": "50",  # ms: export soon after each request
    }


@pytest.fixture(scope="module")
def traced(receiver: OtlpReceiver) -> Iterator[LocalStack]:
    opts = ephemeral(servers=2, epp_args=["--tracing"], epp_env=otel_env(receiver))
    with LocalStack(opts) as s:
        yield s


def post(stack: LocalStack, doc: dict[str, Any] | bytes, **headers: str) -> tuple[int, bytes]:
    body = doc if isinstance(doc, bytes) else orjson.dumps(doc)
    status, _, answer = request(f"{stack.envoy_url}/v1/completions", body, headers=headers)
    return status, answer


def request_span(receiver: OtlpReceiver, trace_id: str) -> ReceivedSpan:
    spans = wait_for(lambda: receiver.named("epp.request", trace_id), what="the request span")
    (span,) = spans
    return span


def last_traceparent(stack: LocalStack, address: str) -> str:
    url = stack.sim_urls[stack.sim_addresses.index(address)]
    return str(get_json(f"{url}/sim/last-request")["headers"].get("traceparent", ""))


def test_a_request_continues_the_clients_trace_to_the_model_server(
    traced: LocalStack, receiver: OtlpReceiver
) -> None:
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    status, body = post(
        traced,
        {"model": MODEL, "prompt": "Hello", "max_tokens": 3},
        traceparent=f"00-{trace_id}-{CLIENT_SPAN}-01",
        **{"x-request-id": "traced-1"},
    )
    assert status == 200, body[:300]
    span = request_span(receiver, trace_id)
    assert span.parent_span_id == CLIENT_SPAN
    assert span.service == "epp-e2e"
    endpoint = span.attributes["epp.endpoint"]
    assert endpoint in traced.sim_addresses
    assert span.attributes["epp.request_id"] == "traced-1"
    assert span.attributes["gen_ai.request.model"] == MODEL
    assert span.attributes["http.response.status_code"] == 200
    assert span.attributes["epp.outcome"] in ("complete", "ended")
    assert span.status_code != ERROR
    (schedule,) = receiver.named("epp.schedule", trace_id)
    assert schedule.parent_span_id == span.span_id
    assert schedule.attributes["epp.endpoint"] == endpoint
    assert span.start_ns <= schedule.start_ns <= schedule.end_ns <= span.end_ns
    # the server that answered continues the trace under the EPP's span
    assert last_traceparent(traced, endpoint) == f"00-{trace_id}-{span.span_id}-01"


def test_without_a_traceparent_a_trace_starts_at_the_epp(
    traced: LocalStack, receiver: OtlpReceiver
) -> None:
    status, body = post(
        traced, {"model": MODEL, "prompt": "untraced client", "max_tokens": 2},
        **{"x-request-id": "traced-new"},
    )  # fmt: skip
    assert status == 200, body[:300]
    spans = wait_for(
        lambda: [
            s
            for s in receiver.named("epp.request")
            if s.attributes.get("epp.request_id") == "traced-new"
        ],
        what="the request span",
    )
    (span,) = spans
    assert span.parent_span_id == ""
    endpoint = span.attributes["epp.endpoint"]
    version, trace_id, span_id, flags = last_traceparent(traced, endpoint).split("-")
    assert (version, trace_id, span_id) == ("00", span.trace_id, span.span_id)
    assert int(flags, 16) & 1  # sampled (the SDK may add the "random trace id" flag)


def test_a_request_the_epp_rejects_is_an_error_span(
    traced: LocalStack, receiver: OtlpReceiver
) -> None:
    trace_id = "0af7651916cd43dd8448eb211c80319c"
    status, _ = post(traced, b"{bad", traceparent=f"00-{trace_id}-{CLIENT_SPAN}-01")
    assert status == 400
    span = request_span(receiver, trace_id)
    assert span.status_code == ERROR
    assert span.attributes["http.response.status_code"] == 400
    assert span.attributes["epp.error.code"] == "invalid_json"
    assert not receiver.named("epp.schedule", trace_id)


def test_the_prefill_leg_is_a_span_and_carries_the_trace(receiver: OtlpReceiver) -> None:
    opts = ephemeral(
        servers=0, prefill=1, decode=1, coordinator="nixl", sim_args=["--time-scale", "0.05"],
        epp_args=["--tracing"], epp_env=otel_env(receiver),
    )  # fmt: skip
    trace_id = "5b8efff798038103d269b633813fc60c"
    long = "Background for the question that follows. " * 60  # disaggregated
    with LocalStack(opts) as pd:
        status, body = post(
            pd,
            {"model": MODEL, "prompt": f"traced {long}", "max_tokens": 3},
            traceparent=f"00-{trace_id}-{CLIENT_SPAN}-01",
        )
        assert status == 200, body[:300]
        span = request_span(receiver, trace_id)
        (prefill,) = wait_for(lambda: receiver.named("epp.prefill", trace_id), what="prefill")
        assert prefill.parent_span_id == span.span_id
        prefill_server, decode_server = pd.sim_addresses  # the plan's order
        assert prefill.attributes["epp.prefill_endpoint"] == prefill_server
        assert prefill.attributes["epp.coordinator"] == "nixl"
        assert span.attributes["epp.endpoint"] == decode_server
        (schedule,) = receiver.named("epp.schedule", trace_id)
        assert schedule.attributes["epp.pd.decision"] == "disaggregated"
        assert schedule.end_ns <= prefill.start_ns <= prefill.end_ns <= span.end_ns
        # the prefill server got the prefill span, the decode server the request's
        assert last_traceparent(pd, prefill_server) == f"00-{trace_id}-{prefill.span_id}-01"
        assert last_traceparent(pd, decode_server) == f"00-{trace_id}-{span.span_id}-01"
