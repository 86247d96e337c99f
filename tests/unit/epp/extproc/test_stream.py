"""The per-stream state machine, fed the exact protobuf messages Envoy sends."""

import asyncio
import json
import random
from pathlib import Path

import orjson
import pytest
from envoy.extensions.filters.http.ext_proc.v3.processing_mode_pb2 import ProcessingMode
from envoy.service.ext_proc.v3.external_processor_pb2 import ProcessingRequest
from google.protobuf.struct_pb2 import Value

from epp.config import build_scheduler
from epp.datastore import Datastore
from epp.extproc.messages import MAX_CHUNK_BYTES
from epp.extproc.stream import ExtProcStream, Phase
from epp.observability.metrics import EppMetrics
from epp.router import Router
from epp.types import Endpoint
from epp.xds.eds import EnvoySync
from tests.support import extproc as m

LEAST_REQUEST = (Path(__file__).parents[4] / "configs" / "least-request.yaml").read_text()
BODY = orjson.dumps({"model": "m", "prompt": "hello " * 50, "max_tokens": 4})


def make_router(n: int = 2, max_body: int = 1 << 20, envoy_sync: EnvoySync | None = None) -> Router:
    ds = Datastore()
    for i in range(n):
        ds.add(Endpoint("127.0.0.1", 8000 + i))
    return Router(
        ds,
        build_scheduler(LEAST_REQUEST),
        EppMetrics(ds),
        max_body_bytes=max_body,
        rng=random.Random(0),
        envoy_sync=envoy_sync,
    )


def run(stream: ExtProcStream, msgs: list) -> list:  # type: ignore[type-arg]
    out = []
    for msg in msgs:
        out.extend(m.replies(stream.on_message(msg)))
    return out


@pytest.mark.parametrize("cut", range(0, len(BODY) + 1, 7))
def test_body_split_anywhere_is_held_then_routed_and_echoed(cut: int) -> None:
    router = make_router()
    stream = ExtProcStream(router)
    assert m.replies(stream.on_message(m.request_headers())) == []  # held until the body ends
    replies = run(stream, m.chunked(BODY, cut))
    head, body = replies[0], replies[1:]
    headers = m.set_headers(head)
    dest = headers["x-gateway-destination-endpoint"]
    assert dest in {"127.0.0.1:8000", "127.0.0.1:8001"}
    assert (
        head.dynamic_metadata.fields["envoy.lb"]
        .struct_value.fields["x-gateway-destination-endpoint"]
        .string_value
        == dest
    )
    assert head.request_headers.response.clear_route_cache
    assert headers["content-length"] == str(len(BODY))
    assert m.streamed_body(body) == (BODY, True)
    assert router.datastore.in_flight(dest) == 1
    assert stream.phase is Phase.UPSTREAM


def test_large_body_is_echoed_in_bounded_chunks() -> None:
    big = orjson.dumps({"model": "m", "prompt": "x" * (3 * MAX_CHUNK_BYTES + 17)})
    stream = ExtProcStream(make_router())
    stream.on_message(m.request_headers())
    replies = run(stream, m.chunked(big, 1000, 70_000))
    chunks = [r.request_body.response.body_mutation.streamed_response for r in replies[1:]]
    assert all(len(c.body) <= MAX_CHUNK_BYTES for c in chunks)
    assert [c.end_of_stream for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert b"".join(c.body for c in chunks) == big


def test_bodyless_request_is_answered_at_once() -> None:
    stream = ExtProcStream(make_router())
    [reply] = m.replies(
        stream.on_message(m.request_headers(method="GET", path="/v1/models", end_of_stream=True))
    )
    assert "x-gateway-destination-endpoint" in m.set_headers(reply)
    assert "content-length" not in m.set_headers(reply)


def test_post_without_body_is_400() -> None:
    stream = ExtProcStream(make_router())
    [reply] = m.replies(stream.on_message(m.request_headers(end_of_stream=True)))
    assert reply.immediate_response.status.code == 400
    assert json.loads(reply.immediate_response.body)["error"]["code"] == "empty_body"


def test_client_routing_headers_are_stripped_and_request_id_generated() -> None:
    stream = ExtProcStream(make_router())
    stream.on_message(
        m.request_headers(
            {
                "x-gateway-destination-endpoint": "6.6.6.6:1",
                "x-gateway-destination-endpoint-subset": "6.6.6.6:1",
                "x-prefiller-host-port": "6.6.6.6:2",
                "x-prefiller-fallbacks": "6.6.6.6:3",
                "x-other": "kept",
            }
        )
    )
    [head, *_] = run(stream, m.chunked(BODY))
    assert sorted(m.removed_headers(head)) == [
        "x-gateway-destination-endpoint-subset",
        "x-prefiller-fallbacks",
        "x-prefiller-host-port",
    ]
    headers = m.set_headers(head)
    assert headers["x-gateway-destination-endpoint"] != "6.6.6.6:1"  # overwritten
    assert len(headers["x-request-id"]) == 32


def test_existing_request_id_is_kept() -> None:
    stream = ExtProcStream(make_router())
    stream.on_message(m.request_headers({"x-request-id": "abc"}))
    [head, *_] = run(stream, m.chunked(BODY))
    assert "x-request-id" not in m.set_headers(head)


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b"{oops", 400, "invalid_json"),
        (b"[]", 400, "invalid_body"),
        (b'{"prompt": "x"}', 400, "missing_model"),
        (b"", 400, "empty_body"),
    ],
)
def test_bad_bodies_get_json_errors(body: bytes, status: int, code: str) -> None:
    router = make_router()
    stream = ExtProcStream(router)
    stream.on_message(m.request_headers())
    [reply] = m.replies(stream.on_message(m.request_body(body, True)))
    imm = reply.immediate_response
    assert imm.status.code == status
    assert json.loads(imm.body)["error"]["code"] == code
    assert {h.header.key: h.header.raw_value for h in imm.headers.set_headers} == {
        "content-type": b"application/json"
    }
    assert router.datastore.total_in_flight() == 0


def test_body_over_the_limit_is_413_as_soon_as_it_is_exceeded() -> None:
    router = make_router(max_body=100)
    stream = ExtProcStream(router)
    stream.on_message(m.request_headers())
    assert m.replies(stream.on_message(m.request_body(b"x" * 60, False))) == []
    [reply] = m.replies(stream.on_message(m.request_body(b"x" * 60, False)))
    assert reply.immediate_response.status.code == 413
    assert "100 bytes" in json.loads(reply.immediate_response.body)["error"]["message"]
    assert m.replies(stream.on_message(m.request_body(b"x", True))) == []  # rest is dropped


def test_no_endpoint_is_503() -> None:
    stream = ExtProcStream(make_router(n=0))
    stream.on_message(m.request_headers())
    [reply] = m.replies(stream.on_message(m.request_body(BODY, True)))
    assert reply.immediate_response.status.code == 503


def test_response_path_releases_in_flight_and_counts_usage() -> None:
    router = make_router()
    stream = ExtProcStream(router)
    stream.on_message(m.request_headers())
    run(stream, m.chunked(BODY))
    assert router.datastore.total_in_flight() == 1
    [r] = m.replies(stream.on_message(m.response_headers(200)))
    assert r.HasField("response_headers")
    usage = b'{"usage": {"prompt_tokens": 75, "completion_tokens": 4}}'
    [r] = m.replies(stream.on_message(m.response_body(usage[:10], False)))
    assert r.HasField("response_body") and not r.response_body.HasField("response")
    assert router.datastore.total_in_flight() == 1
    running = router.metrics.registry.get_sample_value
    labels = {"model_name": "m", "target_model_name": "m"}
    assert running("llm_d_epp_request_running", {**labels, "fairness_id": "default-flow",
                                                 "priority": "0"}) == 1  # fmt: skip
    stream.on_message(m.response_body(usage[10:], True))
    assert router.datastore.total_in_flight() == 0
    assert running("inference_objective_running_requests", {"model_name": "m"}) == 0
    assert router.metrics.tokens.labels("prompt")._value.get() == 75
    stream.close()  # and closing afterwards does not release twice
    assert router.datastore.total_in_flight() == 0


def test_full_duplex_response_mode_echoes_chunks() -> None:
    stream = ExtProcStream(make_router())
    stream.on_message(m.request_headers(response_body_mode=ProcessingMode.FULL_DUPLEX_STREAMED))
    run(stream, m.chunked(BODY))
    stream.on_message(m.response_headers(200))
    [r] = m.replies(stream.on_message(m.response_body(b"data: x\n\n", False)))
    assert r.response_body.response.body_mutation.streamed_response.body == b"data: x\n\n"


def with_subset(msg: ProcessingRequest, addresses: list[str]) -> ProcessingRequest:
    hint = msg.metadata_context.filter_metadata["envoy.lb.subset_hint"]
    hint.fields["x-gateway-destination-endpoint-subset"].list_value.values.extend(
        Value(string_value=a) for a in addresses
    )
    return msg


def test_subset_hint_from_envoy_metadata_limits_the_pick() -> None:
    for _ in range(10):
        stream = ExtProcStream(make_router())
        stream.on_message(with_subset(m.request_headers(), ["127.0.0.1:8001"]))
        [head, *_] = run(stream, m.chunked(BODY))
        assert m.set_headers(head)["x-gateway-destination-endpoint"] == "127.0.0.1:8001"
    stream = ExtProcStream(make_router())
    stream.on_message(with_subset(m.request_headers(), ["10.9.9.9:1"]))
    [reply] = m.replies(stream.on_message(m.request_body(BODY, True)))
    assert reply.immediate_response.status.code == 503
    assert json.loads(reply.immediate_response.body)["error"]["code"] == "no_endpoint_in_subset"


@pytest.mark.parametrize("as_list", [False, True])
def test_the_served_endpoint_is_read_from_envoy_lb_metadata(as_list: bool) -> None:
    """A proxy reporting x-gateway-destination-endpoint-served: the response is
    accounted to that endpoint, and a primary that was failed over from is blamed."""
    router = make_router()
    stream = ExtProcStream(router)
    stream.on_message(m.request_headers())
    [head, *_] = run(stream, m.chunked(BODY))
    picked = m.set_headers(head)["x-gateway-destination-endpoint"]
    other = next(a for a in ("127.0.0.1:8000", "127.0.0.1:8001") if a != picked)
    msg = m.response_headers(200)
    field = msg.metadata_context.filter_metadata["envoy.lb"].fields[
        "x-gateway-destination-endpoint-served"
    ]
    if as_list:
        field.list_value.values.append(Value(string_value=other))
    else:
        field.string_value = other
    stream.on_message(msg)
    stream.on_message(m.response_body(b"{}", True))
    assert router.metrics.responses.labels(other, "2xx")._value.get() == 1
    assert router.metrics.responses.labels(picked, "2xx")._value.get() == 0


def test_buffered_body_is_routed_on_the_body_without_echo() -> None:
    router = make_router()
    stream = ExtProcStream(router)
    [head] = m.replies(
        stream.on_message(m.request_headers(request_body_mode=ProcessingMode.BUFFERED))
    )
    assert head.HasField("request_headers") and not head.request_headers.HasField("response")
    [reply] = m.replies(stream.on_message(m.request_body(BODY, True)))
    common = reply.request_body.response
    headers = {
        h.header.key: h.header.raw_value.decode() for h in common.header_mutation.set_headers
    }
    assert headers["x-gateway-destination-endpoint"] in {"127.0.0.1:8000", "127.0.0.1:8001"}
    assert "content-length" not in headers  # the body is unchanged
    assert common.clear_route_cache and not common.HasField("body_mutation")
    assert "envoy.lb" in reply.dynamic_metadata.fields
    assert router.datastore.total_in_flight() == 1


def test_close_mid_stream_releases() -> None:
    router = make_router()
    stream = ExtProcStream(router)
    stream.on_message(m.request_headers())
    run(stream, m.chunked(BODY))
    stream.on_message(m.response_headers(200))
    stream.on_message(m.response_body(b"data: partial\n\n", False))
    assert router.datastore.total_in_flight() == 1
    stream.close()
    assert router.datastore.total_in_flight() == 0


def test_trailers_end_the_body() -> None:
    stream = ExtProcStream(make_router())
    stream.on_message(m.request_headers())
    assert m.replies(stream.on_message(m.request_body(BODY, False))) == []
    from envoy.service.ext_proc.v3.external_processor_pb2 import HttpTrailers, ProcessingRequest

    replies = m.replies(stream.on_message(ProcessingRequest(request_trailers=HttpTrailers())))
    assert replies[0].HasField("request_headers")
    assert m.streamed_body(replies[1:-1]) == (BODY, False)
    assert replies[-1].HasField("request_trailers")


async def test_an_eds_envoy_gets_no_pick_before_it_acknowledged_our_endpoints() -> None:
    """Just after an EPP (re)start, Envoy may still hold the old endpoint list: the
    answer waits for its EDS acknowledgement; an original-dst Envoy (one destination,
    no EDS) never waits."""
    sync = EnvoySync()
    router = make_router(envoy_sync=sync)
    original_dst = ExtProcStream(router, max_destinations=1)
    assert len(run(original_dst, [m.request_headers(), *m.chunked(BODY)])) == 2
    original_dst.close()
    stream = ExtProcStream(router, max_destinations=3)
    stream.on_message(m.request_headers())
    pending = stream.on_message(m.request_body(BODY, end_of_stream=True))
    assert pending.wait is not None
    waiting = asyncio.ensure_future(m.settle(stream, pending))
    await asyncio.sleep(0)
    assert not waiting.done() and sum(router.datastore.snapshot().in_flight.values()) == 0
    sync.acknowledged()
    replies = await asyncio.wait_for(waiting, 5)
    assert m.set_headers(replies[0])["x-gateway-destination-endpoint"].startswith("127.0.0.1:")
    assert stream.phase is Phase.UPSTREAM


async def test_a_stream_closed_while_waiting_for_eds_sends_nothing() -> None:
    sync = EnvoySync()
    router = make_router(envoy_sync=sync)
    stream = ExtProcStream(router, max_destinations=3)
    stream.on_message(m.request_headers())
    pending = stream.on_message(m.request_body(BODY, end_of_stream=True))
    assert pending.wait is not None
    stream.close()
    sync.acknowledged()
    assert await m.settle(stream, pending) == []


def test_a_streamed_response_teaches_the_latency_model_and_a_models_listing_does_not() -> None:
    router = make_router(n=1)
    model = router.scheduler.latency
    stream = ExtProcStream(router)
    body = orjson.dumps({"model": "m", "prompt": "hi " * 40, "max_tokens": 3, "stream": True})
    run(stream, [m.request_headers(), m.request_body(body, True)])
    stream.on_message(m.response_headers(200))
    stream.on_message(m.response_body(b'data: {"choices": [{"text": "a"}]}\n\n', False))
    usage = b'data: {"usage": {"prompt_tokens": 30, "completion_tokens": 3, '
    usage += b'"prompt_tokens_details": {"cached_tokens": 16}}}\n\ndata: [DONE]\n\n'
    stream.on_message(m.response_body(usage, True))
    learned = model.status("127.0.0.1:8000")
    assert learned is not None
    assert (learned["completions"], learned["ttft_samples"]) == (1, 1)
    # a GET without a body is forwarded, not an inference request: nothing to learn
    listing = ExtProcStream(router)
    listing.on_message(m.request_headers(path="/v1/models", method="GET", end_of_stream=True))
    listing.on_message(m.response_headers(200))
    listing.on_message(m.response_body(b'{"data": []}', True))
    assert model.status("127.0.0.1:8000")["completions"] == 1  # type: ignore[index]
