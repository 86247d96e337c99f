"""The built-in observers besides metrics: what learns from each request's outcome
(the latency model, the token ratio, failure ejection, LoRA placement), flow
control's count of each flow's requests in flight, and ORCA load from response
headers. :func:`builtin_observers` lists them in the order they are registered.
Observers that are optional (on a flag) are modules of this package."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Protocol

from epp.common.usage import Usage
from epp.datalayer.orca import (
    ORCA_BIN_HEADER,
    ORCA_HEADER,
    OrcaParseError,
    merge_orca,
    parse_orca,
)
from epp.datastore import Datastore
from epp.flowcontrol.controller import FlowController
from epp.lifecycle.hooks import LifecycleObserver, Routing
from epp.lifecycle.metered import MetricsObserver
from epp.lora.placement import AdapterPlacement
from epp.observability.metrics import EppMetrics
from epp.scheduling.latency import Dispatch, LatencyModel, TokenRatio

log = logging.getLogger(__name__)

# How long after an endpoint's status change a failover away from it is not held
# against it (Envoy may not have its EDS update yet).
EDS_SETTLE_S = 1.0


class EndpointOutcomes(Protocol):
    """Told how each routed request went on its endpoint (failure ejection)."""

    def failure(self, address: str, reason: str, slow: bool = False, serving: bool = False) -> None:
        """``serving``: the server answered, wrongly (a 5xx)."""

    def success(self, address: str) -> None: ...


class LatencyLearning(LifecycleObserver):
    """The latency model learns from a success served where it was sent (not after a
    failover); ``on_error``: the prediction's error in time to first token."""

    def __init__(
        self,
        latency: LatencyModel,
        clock: Callable[[], float],
        on_error: Callable[[float], None],
    ) -> None:
        self.latency = latency
        self.clock = clock
        self.on_error = on_error

    def response_complete(
        self, routing: Routing, status: int, served: str, usage: Usage | None
    ) -> None:
        request, result = routing.request, routing.result
        pred = result.prediction
        if pred is None or result.prefill is not None or request.model is None:
            return  # nothing to learn from (a disaggregated request: two legs)
        address = result.primary.address
        latency = self.latency
        latency.request_done(address, self.clock())
        if status != 200 or (served and served != address):
            return
        dispatch = Dispatch(address, routing.sent_at, pred, request.stream, routing.first_byte_at)
        error = latency.observe(
            dispatch,
            self.clock(),
            None if usage is None else usage.prompt_tokens,
            None if usage is None else usage.cached_tokens,
            None if usage is None else usage.completion_tokens,
        )
        if error is not None:
            self.on_error(error)


class TokenRatioLearning(LifecycleObserver):
    """Characters per token, from a prompt's text and the server's count of it (a
    prompt of token ids teaches nothing)."""

    def __init__(self, ratio: TokenRatio) -> None:
        self.ratio = ratio

    def response_complete(
        self, routing: Routing, status: int, served: str, usage: Usage | None
    ) -> None:
        if usage is not None:
            request = routing.request
            chars = len(request.prompt) if request.prompt_token_count is None else 0
            self.ratio.observe(chars, usage.prompt_tokens)


class EjectionFeedback(LifecycleObserver):
    """Each response's status, a failover and a stall count towards (or against) the
    endpoint's ejection."""

    def __init__(
        self, outcomes: EndpointOutcomes, datastore: Datastore, clock: Callable[[], float]
    ) -> None:
        self.outcomes = outcomes
        self.datastore = datastore
        self.clock = clock

    def response_status(self, address: str, status: int, served: str) -> None:
        """``served`` another endpoint than ``address``: Envoy failed over (the primary
        could not be reached), which counts against the primary."""
        outcomes = self.outcomes
        if served and served != address:
            member = self.datastore.member(address)
            # Envoy learns a newly active endpoint over EDS a moment after the scheduler
            # may pick it; a failover in that window says nothing about its health
            settled = member is not None and self.clock() - member.since >= EDS_SETTLE_S
            if settled:
                outcomes.failure(address, f"Envoy failed over to {served}")
            address = served
        if status >= 500:
            outcomes.failure(address, f"HTTP {status} on the response path", serving=True)
        else:
            outcomes.success(address)

    def stalled(self, address: str, served: str) -> None:
        self.outcomes.failure(served or address, "streamed response stalled", serving=True)


class PlacementFeedback(LifecycleObserver):
    """LoRA placement learns where each adapter's requests went, and whether the
    server lacked the adapter."""

    def __init__(self, placement: AdapterPlacement) -> None:
        self.placement = placement

    def picked(self, routing: Routing) -> None:
        if not routing.decode_pending:
            self._routed(routing)

    def decode_picked(self, routing: Routing, moved: bool | None) -> None:
        if moved is not None:
            self._routed(routing)

    def _routed(self, routing: Routing) -> None:
        request = routing.request
        if request.lora_adapter and request.model is not None:
            self.placement.routed(request.model, routing.result.primary.address)

    def answered(self, routing: Routing, status: int, served: str) -> None:
        request = routing.request
        if request.lora_adapter and request.model is not None:
            primary = routing.result.primary.address
            self.placement.answered(request.model, primary, status, served)


class FlowInFlight(LifecycleObserver):
    """Flow control's count of each flow's requests in flight, where its fairness
    policy reads it (fair-share): from the pick until the request ends."""

    keeps_note = True

    def __init__(self, flow: FlowController) -> None:
        self.flow = flow

    def picked(self, routing: Routing) -> None:
        flow_id = routing.flow_id
        queues = self.flow.queues
        if flow_id is not None and getattr(queues.policy, "counts_in_flight", False):
            queues.started(flow_id)
            routing.notes[self.note_index] = flow_id

    def ended(self, routing: Routing) -> None:
        flow_id: str | None = routing.notes[self.note_index]
        if flow_id is not None:
            self.flow.queues.ended(flow_id)


class OrcaIngest(LifecycleObserver):
    """ORCA load from a response's headers, fresher than the last scrape."""

    def __init__(
        self, datastore: Datastore, metrics: EppMetrics, clock: Callable[[], float]
    ) -> None:
        self.datastore = datastore
        self.clock = clock
        self._ok = metrics.orca_reports.labels("header", "ok")
        self._malformed = metrics.orca_reports.labels("header", "malformed")

    def response_headers(self, address: str, headers: Mapping[str, str]) -> None:
        if ORCA_HEADER not in headers and ORCA_BIN_HEADER not in headers:
            return
        try:
            report = parse_orca(headers)
        except OrcaParseError as exc:
            self._malformed.inc()
            log.debug("ignoring malformed ORCA header from %s: %s", address, exc)
            return
        if report is None:
            return
        state = self.datastore.get(address)
        if state is not None:
            self.datastore.update_metrics(address, merge_orca(state.metrics, report, self.clock()))
            self._ok.inc()


def builtin_observers(
    metrics: EppMetrics,
    datastore: Datastore,
    latency: LatencyModel,
    flow: FlowController,
    clock: Callable[[], float] = time.monotonic,
) -> list[LifecycleObserver]:
    """What every EPP process observes its requests with (failure ejection and LoRA
    placement, where on, are added beside them: :class:`EjectionFeedback`,
    :class:`PlacementFeedback`)."""
    return [
        OrcaIngest(datastore, metrics, clock),
        MetricsObserver(metrics, clock),
        LatencyLearning(latency, clock, metrics.ttft_error.observe),
        TokenRatioLearning(latency.tokens),
        FlowInFlight(flow),
    ]
