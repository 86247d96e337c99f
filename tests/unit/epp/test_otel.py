"""The OpenTelemetry tracer, as the tracing observer on the lifecycle's hooks, on the
real ext_proc stream and router: the SDK's own in-memory exporter receives the spans;
the replies carry the trace on."""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
from pathlib import Path

import orjson
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from epp.config import build_scheduler
from epp.datastore import Datastore
from epp.disagg.coordinators import DecodeLeg, Handoff
from epp.extproc.stream import ExtProcStream
from epp.flowcontrol.queues import FlowControlConfig
from epp.lifecycle.observers.tracing import Tracing
from epp.observability.metrics import EppMetrics
from epp.observability.otel import OtelTracer
from epp.router import Router, StreamOptions
from epp.types import Endpoint, Role
from tests.support import extproc as m
from tests.support.routers import make_router

REPO = Path(__file__).resolve().parents[3]
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT = "00f067aa0ba902b7"
BODY = orjson.dumps({"model": "m", "prompt": "hello", "max_tokens": 4})


class HeldCoordinator:
    """Runs no leg: answers an empty decode leg once the test releases it."""

    name = "held"
    defers = False

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.handoffs: list[Handoff] = []

    async def hand_off(self, handoff: Handoff) -> DecodeLeg:
        self.handoffs.append(handoff)
        await self.release.wait()
        return DecodeLeg()

    async def close(self) -> None:
        pass


def traced(
    config: str = "", coordinator: HeldCoordinator | None = None, *endpoints: Endpoint
) -> tuple[Router, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    ds = Datastore()
    for e in endpoints or (Endpoint("10.0.0.1", 8000),):
        ds.add(e)
    metrics = EppMetrics(ds)
    tracing = Tracing(OtelTracer(provider), coordinator.name if coordinator else "")
    router = make_router(
        ds, build_scheduler(config), metrics, rng=random.Random(0), coordinator=coordinator,
        stream=StreamOptions(1 << 22), flow=FlowControlConfig(enabled=True),
        observers=[tracing],
    )  # fmt: skip
    return router, exporter


def spans(exporter: InMemorySpanExporter) -> dict[str, ReadableSpan]:
    return {s.name: s for s in exporter.get_finished_spans()}


def hexes(span: ReadableSpan) -> tuple[str, str]:
    assert span.context is not None
    return f"{span.context.trace_id:032x}", f"{span.context.span_id:016x}"


def test_a_request_span_continues_the_clients_trace_and_goes_on_upstream() -> None:
    router, exporter = traced()
    stream = ExtProcStream(router)
    parent = {"traceparent": f"00-{TRACE}-{CLIENT}-01", "x-request-id": "r1"}
    assert m.replies(stream.on_message(m.request_headers(parent))) == []
    replies = m.replies(stream.on_message(m.request_body(BODY, True)))
    assert isinstance(replies, list)
    sent = m.set_headers(replies[0])
    stream.on_message(m.response_headers(200))
    stream.on_message(m.response_body(b'{"usage": {}}', True))
    stream.close()
    got = spans(exporter)
    request, schedule = got["epp.request"], got["epp.schedule"]
    trace_id, span_id = hexes(request)
    assert trace_id == TRACE and request.parent is not None
    assert f"{request.parent.span_id:016x}" == CLIENT
    assert request.kind is SpanKind.SERVER
    assert sent["traceparent"] == f"00-{TRACE}-{span_id}-01"  # replaced for upstream
    attrs = request.attributes or {}
    assert attrs["epp.request_id"] == "r1" and attrs["epp.endpoint"] == "10.0.0.1:8000"
    assert attrs["gen_ai.request.model"] == "m" and attrs["epp.priority"] == 0
    assert attrs["http.response.status_code"] == 200 and attrs["epp.outcome"] == "complete"
    assert [e.name for e in request.events] == ["first byte"]
    assert schedule.parent is not None and schedule.parent.span_id == request.context.span_id
    assert "epp.flow_control" not in got  # not held


def test_a_rejected_request_is_an_error() -> None:
    router, exporter = traced()
    stream = ExtProcStream(router)
    stream.on_message(m.request_headers())
    stream.on_message(m.request_body(b"{bad", True))
    stream.close()
    (request,) = exporter.get_finished_spans()
    assert request.parent is None  # no client trace: it starts here
    assert request.status.status_code is StatusCode.ERROR
    attrs = request.attributes or {}
    assert attrs["http.response.status_code"] == 400 and attrs["epp.error.code"] == "invalid_json"


async def test_a_held_request_has_a_flow_control_span() -> None:
    router, exporter = traced("saturationDetector: {maxConcurrency: 1}")
    first, second = ExtProcStream(router), ExtProcStream(router)
    for stream in (first, second):
        stream.on_message(m.request_headers({"x-gateway-inference-priority": "2"}))
    assert m.replies(first.on_message(m.request_body(BODY, True)))
    held = second.on_message(m.request_body(BODY, True))
    task = asyncio.ensure_future(m.settle(second, held))
    await asyncio.sleep(0.01)
    first.close()  # room frees: the second is dispatched
    replies = await asyncio.wait_for(task, 2)
    assert "traceparent" in m.set_headers(replies[0])
    second.close()
    queued = [s for s in exporter.get_finished_spans() if s.name == "epp.flow_control"]
    (queue,) = queued
    assert (queue.attributes or {})["epp.priority"] == 2
    schedules = [s for s in exporter.get_finished_spans() if s.name == "epp.schedule"]
    assert queue.end_time is not None and queue.end_time <= schedules[-1].start_time  # type: ignore[operator]


async def test_the_prefill_leg_is_a_span_whose_context_goes_to_the_prefill_server() -> None:
    prefill, decode = Endpoint("10.0.0.1", 8000, Role.PREFILL), Endpoint("10.0.0.2", 8000)
    coordinator = HeldCoordinator()
    router, exporter = traced("", coordinator, prefill, decode)
    stream = ExtProcStream(router)
    long = orjson.dumps({"model": "m", "prompt": "a long prompt " * 200, "max_tokens": 5})
    stream.on_message(m.request_headers({"traceparent": f"00-{TRACE}-{CLIENT}-01"}))
    pending = stream.on_message(m.request_body(long, True))
    task = asyncio.ensure_future(m.settle(stream, pending))
    await asyncio.sleep(0.01)
    coordinator.release.set()
    replies = await asyncio.wait_for(task, 2)
    stream.close()
    got = spans(exporter)
    leg, request = got["epp.prefill"], got["epp.request"]
    assert leg.parent is not None and leg.parent.span_id == request.context.span_id
    assert leg.kind is SpanKind.CLIENT
    assert (leg.attributes or {})["epp.prefill_endpoint"] == "10.0.0.1:8000"
    (handoff,) = coordinator.handoffs
    assert handoff.request.headers["traceparent"] == f"00-{TRACE}-{hexes(leg)[1]}-01"
    assert m.set_headers(replies[0])["traceparent"] == f"00-{TRACE}-{hexes(request)[1]}-01"


class DeferringCoordinator(HeldCoordinator):
    """Runs no leg; once released, asks for the decode endpoint as a deferring one does."""

    defers = True

    async def hand_off(self, handoff: Handoff) -> DecodeLeg:
        self.handoffs.append(handoff)
        await self.release.wait()
        handoff.choose_decode(handoff.prefill)
        return DecodeLeg()


async def test_a_deferred_decode_pick_is_where_the_request_span_says_it_went() -> None:
    prefill = Endpoint("10.0.0.1", 8000, Role.PREFILL)
    decodes = [Endpoint("10.0.0.2", 8000, Role.DECODE), Endpoint("10.0.0.3", 8000, Role.DECODE)]
    coordinator = DeferringCoordinator()
    router, exporter = traced("disaggregation: {deferDecode: true}", coordinator, prefill, *decodes)
    stream = ExtProcStream(router)
    long = orjson.dumps({"model": "m", "prompt": "a long prompt " * 200, "max_tokens": 5})
    stream.on_message(m.request_headers({}))
    task = asyncio.ensure_future(m.settle(stream, stream.on_message(m.request_body(long, True))))
    await asyncio.sleep(0.01)
    first = (spans(exporter)["epp.schedule"].attributes or {})["epp.endpoint"]
    router.datastore.remove(str(first))  # gone during the leg: the pick must move
    coordinator.release.set()
    await asyncio.wait_for(task, 2)
    stream.close()
    (other,) = [e.address for e in decodes if e.address != first]
    got = spans(exporter)
    assert (got["epp.request"].attributes or {})["epp.endpoint"] == other
    assert (got["epp.prefill"].attributes or {})["epp.decode_endpoint"] == other
    assert (got["epp.schedule"].attributes or {})["epp.endpoint"] == first


def test_without_tracing_nothing_of_opentelemetry_is_imported() -> None:
    """The request path and `epp serve` load no SDK unless --tracing asks for it."""
    code = (
        "import sys, epp.cli, epp.serving.serve, epp.extproc.stream, epp.router\n"
        "import epp.lifecycle.observers.tracing\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"
