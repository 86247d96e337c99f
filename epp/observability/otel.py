"""The :class:`~epp.observability.tracing.Tracer` of ``epp serve --tracing``: OpenTelemetry's SDK,
exporting over OTLP/HTTP (protobuf), configured by the standard ``OTEL_*`` variables
(docs/tracing.md). Imported only when the flag is on.

Spans of one request (names and attributes: docs/tracing.md): ``epp.request`` (a
server span, child of the client's ``traceparent`` when it sent one) and under it
``epp.flow_control`` (the wait while held), ``epp.schedule`` (the pick) and
``epp.prefill`` (a prefill leg). The model server gets the request span's context in
``traceparent``; a prefill server the prefill span's."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from epp.observability.tracing import RequestTrace
from epp.types import Endpoint, InferenceRequest, SchedulingResult

DEFAULT_SERVICE_NAME = (
    "epp"  # when neither OTEL_SERVICE_NAME nor OTEL_RESOURCE_ATTRIBUTES names one
)
_PROPAGATOR = TraceContextTextMapPropagator()  # W3C traceparent / tracestate


def _now_ns() -> int:
    return time.time_ns()


class OtelTracer:
    """Spans from an SDK TracerProvider; ``provider`` None: one configured from the
    environment (exporter, sampler, batching, resource)."""

    def __init__(self, provider: TracerProvider | None = None) -> None:
        self._provider = provider or provider_from_environment()
        self._tracer = self._provider.get_tracer("epp")

    def start(self, headers: Mapping[str, str], request_id: str) -> RequestTrace:
        parent = _PROPAGATOR.extract(headers)
        span = self._tracer.start_span(
            "epp.request",
            context=parent,
            kind=SpanKind.SERVER,
            attributes={
                "epp.request_id": request_id,
                "http.request.method": headers.get(":method", ""),
                "url.path": headers.get(":path", ""),
            },
        )
        return OtelRequestTrace(self._tracer, span)

    async def close(self) -> None:
        await asyncio.to_thread(self._provider.shutdown)  # flushes the batch


def provider_from_environment() -> TracerProvider:
    """A provider exporting OTLP/HTTP to ``OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT``
    (default ``http://localhost:4318``), sampling as ``OTEL_TRACES_SAMPLER`` says
    (default: parent-based, always on), batching as ``OTEL_BSP_*`` say."""
    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: DEFAULT_SERVICE_NAME}))
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return provider


class OtelRequestTrace:
    """One request's spans (see the module's docstring)."""

    __slots__ = ("_admit_ns", "_context", "_held", "_prefill", "_span", "_status", "_tracer")

    def __init__(self, tracer: trace.Tracer, span: Span) -> None:
        self._tracer = tracer
        self._span = span
        self._context: Context = trace.set_span_in_context(span)
        self._admit_ns = 0
        self._held = False
        self._prefill: Span | None = None
        self._status = 0  # the EPP's own error answer, if any

    def admitting(self) -> None:
        self._admit_ns = _now_ns()

    def held(self) -> None:
        self._held = True

    def routed(
        self,
        request: InferenceRequest,
        result: SchedulingResult,
        scheduling_s: float,
        priority: int,
        fairness_id: str,
    ) -> None:
        end = _now_ns()
        start = max(self._admit_ns, end - int(scheduling_s * 1e9))
        span = self._span
        if request.model is not None:
            span.set_attribute("gen_ai.request.model", request.model)
        span.set_attributes(
            {
                "epp.endpoint": result.primary.address,
                "epp.priority": priority,
                "epp.fairness_id": fairness_id,
            }
        )
        if self._held:
            queue = self._child("epp.flow_control", self._admit_ns)
            queue.set_attributes({"epp.priority": priority, "epp.fairness_id": fairness_id})
            queue.end(start)
        attributes: dict[str, str | int | float] = {
            "epp.endpoint": result.primary.address,
            "epp.targets": result.header_value,
        }
        if result.decision:
            attributes["epp.pd.decision"] = result.decision
        if result.prefill is not None:
            attributes["epp.prefill_endpoint"] = result.prefill.address
        if result.prediction is not None:
            attributes["epp.predicted.ttft_s"] = result.prediction.ttft_s
        schedule = self._child("epp.schedule", start)
        schedule.set_attributes(attributes)
        schedule.end(end)

    def prefill(self, endpoint: Endpoint, coordinator: str) -> Mapping[str, str]:
        span = self._child("epp.prefill", _now_ns(), SpanKind.CLIENT)
        span.set_attributes(
            {"epp.prefill_endpoint": endpoint.address, "epp.coordinator": coordinator}
        )
        self._prefill = span
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier, trace.set_span_in_context(span))
        return carrier

    def prefill_done(self, error: str | None = None, decode: Endpoint | None = None) -> None:
        span, self._prefill = self._prefill, None
        if span is None:
            return
        if decode is not None:  # picked after the leg: the request went there instead
            self._span.set_attribute("epp.endpoint", decode.address)
            span.set_attribute("epp.decode_endpoint", decode.address)
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, error))
        span.end()

    def propagation(self) -> tuple[tuple[str, str], ...]:
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier, self._context)
        return tuple(carrier.items())

    def first_byte(self) -> None:
        self._span.add_event("first byte")

    def rejected(self, status: int, code: str) -> None:
        self._status = status
        self._span.set_attribute("epp.error.code", code)

    def end(self, status: int, outcome: str) -> None:
        self.prefill_done("the stream ended during the prefill leg")
        status = self._status or status
        span = self._span
        span.set_attribute("epp.outcome", outcome)
        if status:
            span.set_attribute("http.response.status_code", status)
        if status >= 500 or self._status:
            span.set_status(Status(StatusCode.ERROR, f"HTTP {status}"))
        span.end()

    def _child(self, name: str, start_ns: int, kind: SpanKind = SpanKind.INTERNAL) -> Span:
        return self._tracer.start_span(name, self._context, kind, start_time=start_ns)
