"""The EPP's own metrics and the llm-d Router's names, recorded from the lifecycle's
hooks."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from epp.common.usage import Usage
from epp.lifecycle.hooks import LifecycleObserver, Routing
from epp.observability.metrics import EppMetrics
from epp.types import InferenceRequest

# a request's note: its llm-d labels (model, fairness id) and what ends its in-flight
# count (inference requests only)
_Note = tuple[tuple[str, str], Callable[[], None]]


class MetricsObserver(LifecycleObserver):
    keeps_note = True

    def __init__(self, metrics: EppMetrics, clock: Callable[[], float]) -> None:
        self.metrics = metrics
        self.clock = clock
        self._routed = metrics.requests.labels("routed")
        self._forwarded = metrics.requests.labels("forwarded")

    def picked(self, routing: Routing) -> None:
        metrics, request, result = self.metrics, routing.request, routing.result
        if request.model is None:  # no body: forwarded, not a scheduling decision
            self._forwarded.inc()
        else:
            seconds = routing.scheduling_s
            metrics.scheduling_seconds.observe(seconds)
            self._routed.inc()
            if result.decision:
                metrics.pd_decisions.labels(result.decision).inc()
            llmd = metrics.llmd
            labels = llmd.labels_of(request.model, request.headers)
            if not routing.decode_pending:  # else once the decode endpoint is known
                llmd.routed(*labels, seconds, result.primary.address, result.decision)
            routing.notes[self.note_index] = (labels, llmd.started(*labels))
        pred = result.prediction
        if pred is not None and pred.meets_slo is not None:
            metrics.slo_predictions.labels("met" if pred.meets_slo else "missed").inc()

    def decode_picked(self, routing: Routing, moved: bool | None) -> None:
        decodes = self.metrics.deferred_decodes
        if moved is None:
            decodes.labels("none").inc()
            return
        decodes.labels("moved" if moved else "same").inc()
        note: _Note | None = routing.notes[self.note_index]
        if note is not None:
            result = routing.result
            self.metrics.llmd.routed(
                *note[0], routing.scheduling_s, result.primary.address, result.decision
            )

    def first_byte(self, routing: Routing) -> None:
        note: _Note | None = routing.notes[self.note_index]
        if note is not None and routing.first_byte_at is not None:
            seconds = routing.first_byte_at - routing.routed_at
            self.metrics.llmd.first_byte(*note[0], seconds, routing.request.stream)

    def response_complete(
        self, routing: Routing, status: int, served: str, usage: Usage | None
    ) -> None:
        metrics = self.metrics
        if usage is not None:
            metrics.tokens.labels("prompt").inc(usage.prompt_tokens)
            metrics.tokens.labels("completion").inc(usage.completion_tokens)
        note: _Note | None = routing.notes[self.note_index]
        if note is not None:
            tokens = None
            if usage is not None:
                tokens = (usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens)
            metrics.llmd.completed(*note[0], self.clock() - routing.routed_at, tokens)

    def ended(self, routing: Routing) -> None:
        note: _Note | None = routing.notes[self.note_index]
        if note is not None:
            note[1]()

    def response_status(self, address: str, status: int, served: str) -> None:
        self.metrics.responses.labels(served or address, f"{status // 100}xx").inc()

    def answered(self, routing: Routing, status: int, served: str) -> None:
        note: _Note | None = routing.notes[self.note_index]
        if note is not None and status != 200:
            self.metrics.llmd.failed(*note[0], status, ours=False)

    def rejected(self, status: int, request: InferenceRequest | None) -> None:
        metrics = self.metrics
        metrics.requests.labels(str(status)).inc()
        model = None if request is None else request.model
        headers: Mapping[str, str] = {} if request is None else request.headers
        metrics.llmd.failed(*metrics.llmd.labels_of(model, headers), status, ours=True)

    def stalled(self, address: str, served: str) -> None:
        self.metrics.stream_stalls.inc()
