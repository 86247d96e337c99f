"""The stream machine's steps as plain data: the waits it asks for, what it answers when
a wait ends (or fails, or ends after the stream did), with nobody performing I/O; the
test hands it each wait's outcome as the driver would."""

from __future__ import annotations

import random
from pathlib import Path

import orjson
import pytest
from envoy.service.ext_proc.v3.external_processor_pb2 import HttpTrailers, ProcessingRequest

from epp.config import build_scheduler
from epp.datastore import Datastore
from epp.errors import ShuttingDownError
from epp.extproc.phases import Phase
from epp.extproc.stream import NOTHING, ExtProcStream, Step
from epp.flowcontrol.controller import FlowController
from epp.flowcontrol.queues import FlowControlConfig
from epp.observability.metrics import EppMetrics
from epp.router import Router
from epp.types import Endpoint
from epp.xds.eds import EnvoySync
from tests.support import extproc as m
from tests.unit.epp.extproc.test_stream_pd import FakeCoordinator
from tests.unit.epp.extproc.test_stream_pd import body as pd_body
from tests.unit.epp.extproc.test_stream_pd import router as pd_router

LEAST_REQUEST = (Path(__file__).parents[4] / "configs" / "least-request.yaml").read_text()
BODY = orjson.dumps({"model": "m", "prompt": "hello " * 50, "max_tokens": 4})
HOLD_ONE = "saturationDetector: {maxConcurrency: 1}"


def make_router(config: str = LEAST_REQUEST, sync: EnvoySync | None = None) -> Router:
    ds = Datastore()
    ds.add(Endpoint("127.0.0.1", 8000))
    metrics = EppMetrics(ds)
    return Router(
        ds, build_scheduler(config), metrics, max_body_bytes=1 << 20, rng=random.Random(0),
        flow=FlowController(FlowControlConfig(enabled=True), metrics), envoy_sync=sync,
    )  # fmt: skip


def extension_s(step: Step) -> float:
    """How long the step's one reply asks Envoy to wait."""
    [reply] = step.replies
    assert reply.HasField("override_message_timeout")
    return reply.override_message_timeout.ToMilliseconds() / 1000


def held(router: Router) -> tuple[ExtProcStream, ExtProcStream, Step]:
    """A stream routed to the one endpoint (which has room for one), and a second one
    whose request flow control holds: its step."""
    first, stream = ExtProcStream(router), ExtProcStream(router)
    for each in (first, stream):
        each.on_message(m.request_headers())
    first.on_message(m.request_body(BODY, True))
    step = stream.on_message(m.request_body(BODY, True))
    assert step.wait is not None and extension_s(step) > 0
    return first, stream, step


def test_a_plain_request_is_answered_in_its_step_without_a_wait() -> None:
    stream = ExtProcStream(make_router())
    assert stream.on_message(m.request_headers()) is NOTHING  # held until the body ends
    step = stream.on_message(m.request_body(BODY, True))
    assert step.wait is None and not step.end_stream
    assert m.set_headers(step.replies[0])["x-gateway-destination-endpoint"] == "127.0.0.1:8000"
    stream.close()


async def test_a_wait_comes_after_the_extension_and_its_end_gives_the_answer() -> None:
    sync = EnvoySync()
    router = make_router(sync=sync)
    stream = ExtProcStream(router, max_destinations=3)
    stream.on_message(m.request_headers())
    step = stream.on_message(m.request_body(BODY, True))
    assert step.wait is not None and not step.end_stream
    assert extension_s(step) > 0 and stream.phase is Phase.ROUTING
    assert router.datastore.total_in_flight() == 0  # nothing picked before the wait ends
    sync.acknowledged()
    await step.wait  # (what the driver awaits: done at once once acknowledged)
    answer = stream.on_waited(None)
    assert answer.wait is None and answer.replies[0].HasField("request_headers")
    assert m.streamed_body(list(answer.replies[1:])) == (BODY, True)
    assert stream.phase is Phase.UPSTREAM
    stream.close()
    assert router.datastore.total_in_flight() == 0


async def test_a_second_wait_asks_envoy_nothing_more_and_trailers_follow_the_answer() -> None:
    sync = EnvoySync()
    router = make_router(config=HOLD_ONE, sync=sync)
    first = ExtProcStream(router)
    first.on_message(m.request_headers())
    first.on_message(m.request_body(BODY, True))  # takes the one endpoint's room
    stream = ExtProcStream(router, max_destinations=3)
    stream.on_message(m.request_headers())
    stream.on_message(m.request_body(BODY, False))
    step = stream.on_message(ProcessingRequest(request_trailers=HttpTrailers()))
    assert step.wait is not None and extension_s(step) > 0  # the EDS wait
    sync.acknowledged()
    await step.wait
    queued = stream.on_waited(None)  # then flow control holds it
    assert queued.wait is not None and queued.replies == ()  # Envoy was asked already
    first.close()  # room frees: the held request is dispatched
    answer = stream.on_waited(await queued.wait)
    assert answer.wait is None
    assert answer.replies[0].HasField("request_headers")
    assert m.streamed_body(list(answer.replies[1:-1])) == (BODY, False)
    assert answer.replies[-1].HasField("request_trailers")
    stream.close()
    assert router.datastore.total_in_flight() == 0


async def test_a_failed_wait_is_the_clients_answer() -> None:
    router = make_router(config=HOLD_ONE)
    first, stream, step = held(router)
    router.flow.close()  # shutdown: every held request is answered 503
    with pytest.raises(ShuttingDownError) as raised:
        await step.wait
    answer = stream.on_wait_failed(raised.value)
    [reply] = answer.replies
    assert reply.immediate_response.status.code == 503 and answer.wait is None
    assert stream.phase is Phase.DONE
    first.close()
    stream.close()
    assert router.datastore.total_in_flight() == 0


async def test_an_internal_failure_of_a_wait_is_a_500_that_names_nothing_inside() -> None:
    coordinator = FakeCoordinator(RuntimeError("secret detail"), wait=True)
    router = pd_router(coordinator)
    stream = ExtProcStream(router)
    stream.on_message(m.request_headers())
    step = stream.on_message(m.request_body(pd_body(), True))
    assert step.wait is not None and extension_s(step) > 0  # the prefill leg runs first
    coordinator.release.set()
    with pytest.raises(RuntimeError) as raised:
        await step.wait
    [reply] = stream.on_wait_failed(raised.value).replies
    assert reply.immediate_response.status.code == 500
    assert b"secret" not in reply.immediate_response.body
    stream.close()
    assert router.datastore.total_in_flight() == 0


async def test_a_wait_that_ends_after_the_stream_did_answers_nothing_and_holds_nothing() -> None:
    router = make_router(config=HOLD_ONE)
    first, stream, step = held(router)
    first.close()  # room frees: the request is dispatched, it holds the endpoint
    routed = await step.wait
    assert router.datastore.total_in_flight() == 1
    stream.close()  # ... but its client left before the driver got to it
    assert stream.on_waited(routed) is NOTHING
    assert router.datastore.total_in_flight() == 0


def test_a_message_that_breaks_the_protocol_late_ends_the_stream_and_nothing_else() -> None:
    router = make_router()
    stream = ExtProcStream(router)
    stream.on_message(m.request_headers())
    stream.on_message(m.request_body(BODY, True))
    stream.on_message(m.response_headers(200))
    step = stream.on_message(m.request_body(b"more", True))
    assert step.end_stream and "request_body" in step.end_stream
    assert step.replies == () and step.wait is None
    assert router.datastore.total_in_flight() == 0 and stream.phase is Phase.DONE
    stream.close()
