"""The real ``epp serve`` process driven by a real ext_proc gRPC client stub."""

from __future__ import annotations

import json
import queue
import urllib.request

import grpc
import orjson
import pytest
from envoy.service.ext_proc.v3.external_processor_pb2 import ProcessingRequest
from envoy.service.ext_proc.v3.external_processor_pb2_grpc import ExternalProcessorStub
from grpc_health.v1 import health_pb2, health_pb2_grpc

from epp_harness.procs import ManagedProcess
from tests.support import extproc as m
from tests.support.http import metric_sum
from tests.support.wait import wait_for

BODY = orjson.dumps({"model": "m", "prompt": "a long enough prompt " * 20})


def channel(proc: ManagedProcess) -> grpc.Channel:
    return grpc.insecure_channel(f"127.0.0.1:{proc.info['grpc_port']}")


def metrics(proc: ManagedProcess) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{proc.info['http_port']}/metrics") as r:
        return str(r.read().decode())


def in_flight(proc: ManagedProcess) -> int:
    return int(metric_sum(metrics(proc), "epp_in_flight_requests"))


def open_streams(proc: ManagedProcess) -> int:
    text = metrics(proc)
    assert "# TYPE epp_extproc_open_streams gauge" in text
    return int(metric_sum(text, "epp_extproc_open_streams"))


def test_health_services_are_serving(epp_server: ManagedProcess) -> None:
    stub = health_pb2_grpc.HealthStub(channel(epp_server))
    for service in ("liveness", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor"):
        reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING


@pytest.mark.parametrize("cuts", [(), (1,), (len(BODY) - 1,), (5, 50, 100), tuple(range(1, 40))])
def test_body_split_across_messages_round_trips(
    epp_server: ManagedProcess, closed_addresses: list[str], cuts: tuple[int, ...]
) -> None:
    stub = ExternalProcessorStub(channel(epp_server))
    replies = list(stub.Process(iter([m.request_headers(), *m.chunked(BODY, *cuts)]), timeout=10))
    head = m.set_headers(replies[0])
    assert head["x-gateway-destination-endpoint"] in closed_addresses
    assert m.streamed_body(replies[1:]) == (BODY, True)


def test_requests_spread_and_in_flight_returns_to_zero_on_eof(
    epp_server: ManagedProcess, closed_addresses: list[str]
) -> None:
    stub = ExternalProcessorStub(channel(epp_server))
    seen: list[str] = []
    calls, feeds = [], []
    for i in range(4):  # four open streams at once: in-flight load alternates them
        feed: queue.Queue[ProcessingRequest | None] = queue.Queue()
        body = orjson.dumps({"model": "m", "prompt": f"distinct prompt {i} " * 20})
        for msg in (m.request_headers(), m.request_body(body, True)):
            feed.put(msg)
        call = stub.Process(iter(feed.get, None))  # stays open until None is fed
        seen.append(m.set_headers(next(call))["x-gateway-destination-endpoint"])
        calls.append(call)
        feeds.append(feed)
    assert sorted(seen) == sorted(closed_addresses * 2)
    assert in_flight(epp_server) == 4
    assert open_streams(epp_server) == 4
    calls[0].cancel()  # Envoy resets the stream when the client goes away
    feeds[1].put(None)  # or half-closes it
    released = (2, 2)  # (in flight, open streams): each stream's end releases both
    wait_for(
        lambda: (in_flight(epp_server), open_streams(epp_server)) == released,
        what="two streams released and closed",
    )
    for call in calls[2:]:
        call.cancel()
    wait_for(
        lambda: (in_flight(epp_server), open_streams(epp_server)) == (0, 0),
        what="all streams released and closed",
    )


def test_errors_are_immediate_json_and_server_keeps_serving(epp_server: ManagedProcess) -> None:
    stub = ExternalProcessorStub(channel(epp_server))
    [bad] = list(stub.Process(iter([m.request_headers(), m.request_body(b"{", True)])))
    assert bad.immediate_response.status.code == 400
    assert json.loads(bad.immediate_response.body)["error"]["code"] == "invalid_json"
    big = list(stub.Process(iter([m.request_headers(), m.request_body(b"x" * 5000, True)])))
    assert big[0].immediate_response.status.code == 413
    ok = list(stub.Process(iter([m.request_headers(), m.request_body(BODY, True)])))
    assert ok[0].HasField("request_headers")
    text = metrics(epp_server)
    assert 'epp_requests_total{outcome="400"} 1.0' in text
    assert 'epp_requests_total{outcome="413"} 1.0' in text


def test_illegal_messages_get_defined_answers_and_the_server_keeps_serving(
    epp_server: ManagedProcess,
) -> None:
    """Out-of-phase messages through the real server (phases.py): an immediate 500 while
    Envoy could still send it, FAILED_PRECONDITION once the response started; every
    claim is released and the next stream is served."""
    stub = ExternalProcessorStub(channel(epp_server))
    routed = [m.request_headers(), m.request_body(BODY, True)]
    again = m.request_headers(method="GET", path="/v1/models", end_of_stream=True)
    for illegal in (again, m.request_body(b"more", True)):  # 2nd headers, body after end
        *ok, answer = list(stub.Process(iter([*routed, illegal]), timeout=10))
        assert m.set_headers(ok[0])["x-gateway-destination-endpoint"]
        assert answer.immediate_response.status.code == 500
        error = json.loads(answer.immediate_response.body)["error"]
        assert error["code"] == "extproc_protocol_error"
    late = [*routed, m.response_headers(200), m.request_headers()]
    with pytest.raises(grpc.RpcError) as ended:
        list(stub.Process(iter(late), timeout=10))
    assert ended.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "request_headers" in str(ended.value.details())
    wait_for(lambda: in_flight(epp_server) == 0, what="every claim released")
    ok = list(stub.Process(iter(routed), timeout=10))
    assert ok[0].HasField("request_headers")
    text = metrics(epp_server)
    assert 'epp_requests_total{outcome="500"} 2.0' in text
    assert 'epp_requests_total{outcome="routed"} 4.0' in text
    wait_for(
        lambda: 'epp_extproc_streams_total{end="error"} 1.0' in metrics(epp_server),
        what="the ended stream counted",
    )
    wait_for(lambda: open_streams(epp_server) == 0, what="every stream closed, the failed one too")
