"""Glue between the Envoy adapter and the pure scheduler: take a snapshot, schedule,
claim in-flight accounting, count the outcome."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

from epp.datalayer.orca import (
    ORCA_BIN_HEADER,
    ORCA_HEADER,
    OrcaParseError,
    merge_orca,
    parse_orca,
)
from epp.datastore import Datastore, InFlightTicket
from epp.disagg.bodies import without_pd_fields
from epp.disagg.coordinators import Coordinator, DecodeLeg, Handoff
from epp.errors import ClientVisibleError
from epp.metrics import EppMetrics
from epp.scheduling.base import Scheduler
from epp.scheduling.latency import Dispatch
from epp.types import InferenceRequest, SchedulingResult
from epp.usage import Usage
from epp.xds.eds import EnvoySync

log = logging.getLogger(__name__)

# How long after an endpoint's status change a failover away from it is not held
# against it (Envoy may not have its EDS update yet).
EDS_SETTLE_S = 1.0
# Output tokens assumed for in-flight token accounting when a request sets no limit.
DEFAULT_OUTPUT_TOKENS = 256


@dataclass(slots=True)
class Routed:
    result: SchedulingResult
    ticket: InFlightTicket
    # the prefill endpoint's claim while the request lives (sidecar coordinator)
    prefill_ticket: InFlightTicket | None = None
    # what the latency model learns from when the response comes back (None: nothing,
    # e.g. a disaggregated request, whose decode leg starts after the prefill leg)
    dispatch: Dispatch | None = None

    def release(self) -> None:
        self.ticket.release()
        if self.prefill_ticket is not None:
            self.prefill_ticket.release()


class EndpointOutcomes(Protocol):
    """Told how each routed request went on its endpoint (failure ejection)."""

    def failure(self, address: str, reason: str, slow: bool = False, serving: bool = False) -> None:
        """``serving``: the server answered, wrongly (a 5xx)."""

    def success(self, address: str) -> None: ...


class Router:
    def __init__(
        self,
        datastore: Datastore,
        scheduler: Scheduler,
        metrics: EppMetrics,
        *,
        max_body_bytes: int,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
        request_headers: Iterable[tuple[str, str]] = (),
        coordinator: Coordinator | None = None,
        outcomes: EndpointOutcomes | None = None,
        envoy_sync: EnvoySync | None = None,
    ) -> None:
        self.datastore = datastore
        self.scheduler = scheduler
        self.metrics = metrics
        self.max_body_bytes = max_body_bytes
        self.rng = rng or random.Random()
        self.clock = clock
        # headers added to every routed request (e.g. asking vLLM for ORCA load)
        self.request_headers = tuple(request_headers)
        # carries out disaggregated requests; without one they simply decode
        self.coordinator = coordinator
        self.outcomes = outcomes
        # EDS: whether Envoy has this process's endpoints yet (None: never wait)
        self.envoy_sync = envoy_sync
        self._routed = metrics.requests.labels("routed")
        self._forwarded = metrics.requests.labels("forwarded")
        self._orca_ok = metrics.orca_reports.labels("header", "ok")
        self._orca_malformed = metrics.orca_reports.labels("header", "malformed")

    def route(self, request: InferenceRequest, max_destinations: int = 1) -> Routed:
        """Schedule ``request``; the result names at most ``max_destinations`` targets
        (primary first), as many as the Envoy config can use."""
        start = time.perf_counter()
        snapshot = self.datastore.snapshot()
        result = self.scheduler.schedule(request, snapshot, self.rng)
        if len(result.targets) > max_destinations:
            result = replace(result, targets=result.targets[:max_destinations])
        if request.model is None:
            # no body (GET /, /v1/models): it needs an endpoint, but it is no inference
            # request, so it is not a scheduling decision (nor a prefix to remember)
            self._forwarded.inc()
        else:
            self.scheduler.on_routed(request, result, snapshot)
            self.metrics.scheduling_seconds.observe(time.perf_counter() - start)
            self._routed.inc()
            if result.decision:
                self.metrics.pd_decisions.labels(result.decision).inc()
        tokens = request.prompt_tokens + (request.max_tokens or DEFAULT_OUTPUT_TOKENS)
        ticket = self.datastore.acquire(result.primary.address, tokens)
        pred = result.prediction
        if pred is None:
            return Routed(result, ticket)
        if pred.meets_slo is not None:
            self.metrics.slo_predictions.labels("met" if pred.meets_slo else "missed").inc()
        if result.prefill is not None or request.model is None:
            return Routed(result, ticket)  # nothing for the latency model to learn from
        dispatch = Dispatch(result.primary.address, self.clock(), pred, request.stream)
        return Routed(result, ticket, dispatch=dispatch)

    def hand_off(
        self, routed: Routed, request: InferenceRequest, doc: Mapping[str, Any]
    ) -> DecodeLeg | Awaitable[DecodeLeg] | None:
        """The decode leg: from the coordinator when the request is disaggregated, else
        None (the body goes as sent), unless the client sent P/D fields of its own,
        which are dropped."""
        clean = without_pd_fields(doc)
        prefill = routed.result.prefill
        if prefill is None or self.coordinator is None:
            return None if clean is None else DecodeLeg(doc=clean)
        handoff = Handoff(request, doc if clean is None else clean, prefill, routed.result.primary)
        return self.coordinator.hand_off(handoff)

    def rejected(self, error: ClientVisibleError) -> None:
        self.metrics.requests.labels(str(error.status)).inc()

    def response_headers_seen(self, address: str, headers: Mapping[str, str]) -> None:
        """Take ORCA load from a response's headers, fresher than the last scrape."""
        if ORCA_HEADER not in headers and ORCA_BIN_HEADER not in headers:
            return
        try:
            report = parse_orca(headers)
        except OrcaParseError as exc:
            self._orca_malformed.inc()
            log.debug("ignoring malformed ORCA header from %s: %s", address, exc)
            return
        if report is None:
            return
        state = self.datastore.get(address)
        if state is not None:
            self.datastore.update_metrics(address, merge_orca(state.metrics, report, self.clock()))
            self._orca_ok.inc()

    def response_seen(self, address: str, status: int, served: str | None = None) -> None:
        """The response status for a request routed to ``address``. ``served`` is the
        endpoint that answered when Envoy says so: if it is another one, Envoy failed
        over (the primary could not be reached) and that counts against the primary."""
        self.metrics.responses.labels(served or address, f"{status // 100}xx").inc()
        outcomes = self.outcomes
        if outcomes is None:
            return
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

    def first_byte_seen(self, routed: Routed) -> None:
        """The response body's first bytes passed (a streamed response's first token)."""
        dispatch = routed.dispatch
        if dispatch is not None and dispatch.first_byte_at is None:
            dispatch.first_byte_at = self.clock()

    def completed(self, routed: Routed, status: int, served: str, usage: Usage | None) -> None:
        """The whole response passed: count its tokens, and let the latency model learn
        from a success served where it was sent (not after a failover)."""
        if usage is not None:
            self.metrics.tokens.labels("prompt").inc(usage.prompt_tokens)
            self.metrics.tokens.labels("completion").inc(usage.completion_tokens)
        dispatch = routed.dispatch
        if dispatch is None:
            return
        self.scheduler.latency.request_done(dispatch.address, self.clock())
        if status != 200 or (served and served != dispatch.address):
            return
        error = self.scheduler.latency.observe(
            dispatch,
            self.clock(),
            None if usage is None else usage.prompt_tokens,
            None if usage is None else usage.cached_tokens,
            None if usage is None else usage.completion_tokens,
        )
        if error is not None:
            self.metrics.ttft_error.observe(error)
