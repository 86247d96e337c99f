"""``epp serve --tracing``: each request's trace, drawn from the lifecycle's hooks
(registered only with the flag: otherwise nothing of it is on the request path, and the
stream opens no exchange for it).

One :class:`~epp.observability.tracing.RequestTrace` per request, kept in its note from
its headers (``started``) to the end of its stream (``closed``); the spans and
attributes are the tracer's (:mod:`epp.observability.otel`, docs/tracing.md). The trace
context goes on through ``add_headers``: the request span's to the model server, the
prefill span's (started as the leg is) to the prefill server."""

from __future__ import annotations

from collections.abc import Iterable

from epp.flowcontrol.queues import fairness_id
from epp.lifecycle.hooks import Exchange, LifecycleObserver, Routing
from epp.observability.tracing import RequestTrace, Tracer
from epp.types import Endpoint, InferenceRequest


class Tracing(LifecycleObserver):
    """Traces every request with ``tracer``; ``coordinator``: the P/D coordinator's
    name, which a prefill leg's span carries."""

    keeps_note = True

    def __init__(self, tracer: Tracer, coordinator: str) -> None:
        self.tracer = tracer
        self.coordinator = coordinator

    def started(self, exchange: Exchange) -> None:
        exchange.notes[self.note_index] = self.tracer.start(exchange.headers, exchange.request_id)

    def admitting(self, exchange: Exchange, request: InferenceRequest) -> None:
        self._trace(exchange).admitting()

    def held(self, exchange: Exchange, request: InferenceRequest) -> None:
        self._trace(exchange).held()

    def admitted(self, exchange: Exchange, routing: Routing, priority: int) -> None:
        request = routing.request
        self._trace(exchange).routed(
            request, routing.result, routing.scheduling_s, priority, fairness_id(request.headers)
        )

    def add_headers(self, routing: Routing, prefill: Endpoint | None) -> Iterable[tuple[str, str]]:
        trace: RequestTrace | None = routing.notes[self.note_index]
        if trace is None:  # routed without an exchange (not through a stream)
            return ()
        if prefill is None:
            return trace.propagation()
        return trace.prefill(prefill, self.coordinator).items()

    def prefill_done(self, routing: Routing, error: str | None, decode: Endpoint | None) -> None:
        trace: RequestTrace | None = routing.notes[self.note_index]
        if trace is not None:
            trace.prefill_done(error, decode)

    def first_byte(self, routing: Routing) -> None:
        trace: RequestTrace | None = routing.notes[self.note_index]
        if trace is not None:
            trace.first_byte()

    def closed(self, exchange: Exchange, status: int, outcome: str) -> None:
        trace = self._trace(exchange)
        refused = exchange.refused
        if refused is not None:
            trace.rejected(*refused)
        trace.end(status, outcome)

    def _trace(self, exchange: Exchange) -> RequestTrace:
        trace: RequestTrace = exchange.notes[self.note_index]
        return trace
