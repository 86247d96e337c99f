"""Requests for LoRA adapters the servers hold, in the default config (placement off),
through the ext_proc state machine: the destination list (primary and fallbacks) holds
only the servers that have the adapter; a base model and an adapter nobody holds go
as before; an answer that says a server lacks the adapter (a 404, or Envoy answering
from the next of the list) takes it off that server; the in-flight count returns to 0."""

from __future__ import annotations

import logging
import random
import time

import orjson
import pytest
from envoy.service.ext_proc.v3.external_processor_pb2 import ProcessingResponse

from epp.config import build_scheduler
from epp.datastore import Datastore
from epp.extproc.stream import ExtProcStream
from epp.lora.placement import AdapterPlacement, PlacementConfig
from epp.observability.metrics import EppMetrics
from epp.router import Router
from epp.types import Endpoint, EndpointMetrics
from tests.support import extproc as m

SERVERS = [Endpoint("127.0.0.1", 8000 + i) for i in range(4)]
S0, S1, S2, S3 = (e.address for e in SERVERS)
HELD = {S0: ["a1"], S1: ["a2"], S2: ["a2"], S3: []}


def make_router(seed: int = 0) -> Router:
    ds = Datastore()
    for e in SERVERS:
        ds.add(e)
    metrics = EppMetrics(ds)
    placement = AdapterPlacement(PlacementConfig(), dict, ds, metrics)
    for address, adapters in HELD.items():  # what their /v1/models listed
        placement.holdings.listed(address, adapters)
    return Router(
        ds, build_scheduler(""), metrics, max_body_bytes=1 << 20,
        rng=random.Random(seed), placement=placement,
    )  # fmt: skip


def routed(router: Router, model: str, **headers: str) -> tuple[ExtProcStream, ProcessingResponse]:
    """A request for ``model``: its stream and the EPP's answer to its headers."""
    stream = ExtProcStream(router, max_destinations=3)
    body = orjson.dumps({"model": model, "prompt": f"hello {model}", "max_tokens": 2})
    stream.on_message(m.request_headers(headers))
    replies = list(m.replies(stream.on_message(m.request_body(body, True))))
    return stream, replies[0]


def send(router: Router, model: str) -> tuple[ExtProcStream, list[str]]:
    """A request for ``model``: its stream and the destination list the EPP answered."""
    stream, head = routed(router, model)
    return stream, m.set_headers(head)["x-gateway-destination-endpoint"].split(",")


def answer(stream: ExtProcStream, status: int, served: str = "") -> None:
    msg = m.response_headers(status)
    if served:
        field = msg.metadata_context.filter_metadata["envoy.lb"].fields[
            "x-gateway-destination-endpoint-served"
        ]
        field.string_value = served
    stream.on_message(msg)
    stream.on_message(m.response_body(b"{}", True))


def in_flight(router: Router) -> list[int]:
    return [router.datastore.in_flight(e.address) for e in SERVERS]


@pytest.mark.parametrize("seed", range(20))
def test_the_destination_list_holds_only_servers_with_the_adapter(seed: int) -> None:
    router = make_router(seed)
    for model, holders in (("a1", {S0}), ("a2", {S1, S2})):
        stream, targets = send(router, model)
        assert set(targets) == holders  # every holder, and nothing else
        answer(stream, 200)
    assert in_flight(router) == [0, 0, 0, 0]


def test_where_the_adapter_runs_comes_first_and_the_other_holders_after_it() -> None:
    """The LoRA filter keeps only the server where a2 is active: the other holder is
    still on the list, for Envoy's retry."""
    router = make_router()
    running = EndpointMetrics(time.monotonic(), lora_running=frozenset({"a2"}), max_lora=2)
    router.datastore.update_metrics(S2, running)
    stream, targets = send(router, "a2")
    assert targets == [S2, S1]
    answer(stream, 200)
    assert in_flight(router) == [0, 0, 0, 0]


def test_only_an_adapter_request_asks_envoy_to_retry_a_404() -> None:
    """x-epp-retry-404 selects the Envoy route that retries a 404 on the next of the
    list: set for an adapter (its list holds only holders), removed when a client sends
    it with any other request."""
    router = make_router()
    stream, head = routed(router, "a2")
    assert m.set_headers(head)["x-epp-retry-404"] == "true"
    answer(stream, 200)
    stream, head = routed(router, "sim-model", **{"x-epp-retry-404": "true"})
    assert "x-epp-retry-404" not in m.set_headers(head)
    assert "x-epp-retry-404" in m.removed_headers(head)
    answer(stream, 200)
    assert in_flight(router) == [0, 0, 0, 0]


def test_a_base_model_and_an_adapter_nobody_holds_go_anywhere() -> None:
    router = make_router()
    for model in ("sim-model", "nope"):
        stream, targets = send(router, model)
        assert len(targets) == 3  # the usual list over the whole pool
        answer(stream, 404 if model == "nope" else 200)
    assert router.placement is not None and router.placement.listing() == HELD
    assert in_flight(router) == [0, 0, 0, 0]


def test_a_404_takes_the_adapter_off_the_server_that_answered_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    router = make_router()
    stream, targets = send(router, "a2")
    answer(stream, 404, served=targets[0])
    [remaining] = {S1, S2} - {targets[0]}
    stream, targets = send(router, "a2")
    assert targets == [remaining]
    answer(stream, 200)
    assert in_flight(router) == [0, 0, 0, 0]
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []


def test_envoy_answering_from_the_next_holder_takes_the_adapter_off_the_first() -> None:
    router = make_router()
    stream, targets = send(router, "a2")
    first, second = targets
    answer(stream, 200, served=second)  # Envoy retried: the first answered 404 (or failed)
    assert router.placement is not None
    assert "a2" not in router.placement.listing()[first]
    stream, targets = send(router, "a2")
    assert targets == [second]
    answer(stream, 200)
    assert in_flight(router) == [0, 0, 0, 0]


def test_when_the_last_holder_lost_it_the_request_goes_anywhere_again() -> None:
    router = make_router()
    stream, targets = send(router, "a1")
    assert targets == [S0]
    answer(stream, 404)  # S0 no longer has a1: nobody does; the servers answer 404
    stream, targets = send(router, "a1")
    assert len(targets) == 3
    answer(stream, 404)
    assert in_flight(router) == [0, 0, 0, 0]
