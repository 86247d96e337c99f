"""Request traces: what the request path tells a tracer, as Protocols (docs/tracing.md).

``epp serve --tracing`` plugs in :mod:`epp.observability.otel` (OpenTelemetry), told
by the tracing observer on the request lifecycle's hooks
(:mod:`epp.lifecycle.observers.tracing`); without the flag that observer is not
registered, no trace object is made and no SDK is imported.

One :class:`RequestTrace` per ext_proc stream: a span for the request, continuing the
client's W3C ``traceparent`` when it sent one, with child spans for the wait in flow
control, the scheduling decision and the prefill leg, and the headers that carry the
trace on to the model servers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from epp.types import Endpoint, InferenceRequest, SchedulingResult

# The W3C Trace Context headers (https://www.w3.org/TR/trace-context/)
TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"


class RequestTrace(Protocol):
    """One request's trace, from its headers to the end of its ext_proc stream."""

    def admitting(self) -> None:
        """Admission starts now (flow control, then scheduling)."""

    def held(self) -> None:
        """Flow control holds the request: it waits from admission on."""

    def routed(
        self,
        request: InferenceRequest,
        result: SchedulingResult,
        scheduling_s: float,
        priority: int,
        fairness_id: str,
    ) -> None:
        """The pick, made just now in ``scheduling_s`` seconds (the wait, if held, ends
        where the scheduling starts)."""

    def prefill(self, endpoint: Endpoint, coordinator: str) -> Mapping[str, str]:
        """A prefill leg starts; the headers that carry its span to the prefill server."""

    def prefill_done(self, error: str | None = None, decode: Endpoint | None = None) -> None:
        """The prefill leg ended (``error``: what went wrong, answered to the client;
        ``decode``: the decode endpoint picked after the leg, with deferred selection)."""

    def propagation(self) -> tuple[tuple[str, str], ...]:
        """The headers that carry the request's span to the model server."""

    def first_byte(self) -> None:
        """The response's first body bytes passed."""

    def rejected(self, status: int, code: str) -> None:
        """The EPP answered the request itself with an error."""

    def end(self, status: int, outcome: str) -> None:
        """The stream ended (``outcome``: how, as ``epp_extproc_streams_total`` counts
        it); ``status``: the response's HTTP status (0: none seen)."""


class Tracer(Protocol):
    def start(self, headers: Mapping[str, str], request_id: str) -> RequestTrace:
        """A request's trace, starting now, under the client's ``traceparent`` if any."""

    async def close(self) -> None:
        """Export what is pending, then stop (shutdown)."""
