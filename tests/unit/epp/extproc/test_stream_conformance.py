"""The conformance suite's hooks on one ext_proc stream: its selection header is
stripped before the model server, and the served endpoint is echoed when configured."""

from __future__ import annotations

import random
from pathlib import Path

import orjson
import pytest
from envoy.service.ext_proc.v3.external_processor_pb2 import ProcessingRequest, ProcessingResponse
from google.protobuf.struct_pb2 import Value

from epp.config import build_scheduler
from epp.datastore import Datastore
from epp.extproc.stream import ExtProcStream
from epp.observability.metrics import EppMetrics
from epp.router import Router
from epp.types import Endpoint
from tests.support import extproc as m

CONFIGS = Path(__file__).parents[4] / "configs"
BODY = orjson.dumps({"model": "m", "prompt": "hello", "max_tokens": 4})
SELECTION = "test-epp-endpoint-selection"
ECHO = "x-conformance-test-served-endpoint"


def make_router(config: str, echo: bool) -> Router:
    ds = Datastore()
    for port in (3000, 3002, 3004):
        ds.add(Endpoint("127.0.0.1", port))
    return Router(
        ds,
        build_scheduler((CONFIGS / config).read_text()),
        EppMetrics(ds),
        max_body_bytes=1 << 20,
        rng=random.Random(0),
        echo_served_endpoint=echo,
    )


def routed(router: Router, headers: dict[str, str]) -> tuple[ProcessingResponse, ExtProcStream]:
    stream = ExtProcStream(router)
    stream.on_message(m.request_headers(headers))
    head, *_ = m.replies(stream.on_message(m.request_body(BODY, True)))
    return head, stream


def served(address: str) -> ProcessingRequest:
    msg = m.response_headers(200)
    lb = msg.metadata_context.filter_metadata["envoy.lb"]
    lb.fields["x-gateway-destination-endpoint-served"].CopyFrom(Value(string_value=address))
    return msg


def response_set_headers(reply: ProcessingResponse) -> dict[str, str]:
    mutation = reply.response_headers.response.header_mutation
    return {h.header.key: h.header.raw_value.decode() for h in mutation.set_headers}


@pytest.mark.parametrize(
    ("config", "echo"), [("least-request.yaml", False), ("conformance.yaml", True)]
)
def test_the_selection_header_never_reaches_the_model_server(config: str, echo: bool) -> None:
    head, _ = routed(make_router(config, echo), {SELECTION: "127.0.0.1:3002"})
    assert SELECTION in m.removed_headers(head)


def test_without_the_filter_the_selection_header_is_ignored() -> None:
    router = make_router("least-request.yaml", False)
    picks = set()
    for _ in range(30):
        head, stream = routed(router, {SELECTION: "127.0.0.1:3002"})
        picks.add(m.set_headers(head)["x-gateway-destination-endpoint"])
        stream.close()
    assert picks == {"127.0.0.1:3000", "127.0.0.1:3002", "127.0.0.1:3004"}


def test_with_the_conformance_config_the_header_picks_the_endpoint() -> None:
    router = make_router("conformance.yaml", True)
    for _ in range(10):
        head, stream = routed(router, {SELECTION: "127.0.0.1:3002"})
        assert m.set_headers(head)["x-gateway-destination-endpoint"] == "127.0.0.1:3002"
        stream.close()


def test_the_served_endpoint_is_echoed_from_envoy_lb_metadata() -> None:
    _, stream = routed(make_router("conformance.yaml", True), {})
    [reply] = m.replies(stream.on_message(served("127.0.0.1:3004")))
    assert response_set_headers(reply) == {ECHO: "127.0.0.1:3004"}


def test_the_echo_is_left_out_when_the_proxy_reports_no_served_endpoint() -> None:
    _, stream = routed(make_router("conformance.yaml", True), {})
    [reply] = m.replies(stream.on_message(m.response_headers(200)))
    assert response_set_headers(reply) == {}


def test_without_the_setting_nothing_is_echoed() -> None:
    _, stream = routed(make_router("least-request.yaml", False), {})
    [reply] = m.replies(stream.on_message(served("127.0.0.1:3004")))
    assert response_set_headers(reply) == {}
