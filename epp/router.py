"""Glue between the Envoy adapter and the pure scheduler: take a snapshot, schedule,
claim in-flight accounting, count the outcome."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Protocol

from epp.common.usage import Usage
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
from epp.errors import BadRequestError, ClientVisibleError, NoEndpointError, ShedError
from epp.flowcontrol.controller import DISPATCHED, FlowController, Waiting
from epp.flowcontrol.holding import Hold
from epp.flowcontrol.queues import FlowControlConfig, fairness_id, queue_timeout
from epp.flowcontrol.saturation import Room
from epp.lora.holdings import with_holders
from epp.lora.placement import AdapterPlacement
from epp.modelnames import ModelsConfig, Resolved, resolve
from epp.observability.metrics import EppMetrics
from epp.observability.tracing import Tracer
from epp.scheduling.base import Scheduler
from epp.scheduling.latency import Dispatch, slo_missed
from epp.types import Endpoint, InferenceRequest, SchedulingResult, Snapshot
from epp.xds.eds import EnvoySync

log = logging.getLogger(__name__)

# How long after an endpoint's status change a failover away from it is not held
# against it (Envoy may not have its EDS update yet).
EDS_SETTLE_S = 1.0
# Output tokens assumed for in-flight token accounting when a request sets no limit.
DEFAULT_OUTPUT_TOKENS = 256


@dataclass(frozen=True, slots=True)
class DeferredDecode:
    """A disaggregated request whose decode endpoint is picked after its prefill leg."""

    max_destinations: int
    scheduling_s: float  # the first cycle's time (the llm-d metrics count both)


@dataclass(slots=True)
class Routed:
    # deferred decode selection: targets are the first cycle's decode picks until the
    # pick after the prefill leg replaces them
    result: SchedulingResult
    # the claim on the primary target (deferred: on no endpoint yet, Datastore.PENDING)
    ticket: InFlightTicket
    # the prefill endpoint's claim while the request lives (sidecar coordinator)
    prefill_ticket: InFlightTicket | None = None
    # what the latency model learns from when the response comes back (None: nothing,
    # e.g. a disaggregated request, whose decode leg starts after the prefill leg)
    dispatch: Dispatch | None = None
    # what per-request metrics are labelled with and timed from (inference requests)
    labels: tuple[str, str] | None = None  # (model, fairness id); None: not counted
    routed_at: float = 0.0
    streaming: bool = False
    first_byte: bool = False
    scheduling_s: float = 0.0  # how long the pick took (traces)
    on_release: Callable[[], None] | None = None  # once, when it stops being in flight
    deferred: DeferredDecode | None = None  # its decode endpoint is not chosen yet
    # the prompt text's length, to learn characters per token from (0: nothing to
    # learn, e.g. a prompt of token ids, whose tokens were counted)
    prompt_chars: int = 0
    adapter: str | None = None  # the LoRA adapter it names (placement learns from it)

    def release(self) -> None:
        self.ticket.release()
        if self.prefill_ticket is not None:
            self.prefill_ticket.release()
        if self.on_release is not None:
            done, self.on_release = self.on_release, None
            done()


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
        models: ModelsConfig | None = None,
        placement: AdapterPlacement | None = None,
        flow: FlowController | None = None,
        tracer: Tracer | None = None,
        stream_chunk_timeout_s: float = 0.0,
        echo_served_endpoint: bool = False,
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
        # it picks the decode endpoint after the prefill leg (deferred decode selection)
        self.defers = bool(getattr(coordinator, "defers", False))
        self.outcomes = outcomes
        # EDS: whether Envoy has this process's endpoints yet (None: never wait)
        self.envoy_sync = envoy_sync
        # rewrites and the adapter catalogue (replaced on a config reload)
        self.models = models or ModelsConfig()
        # loads adapters where none is (None: placement off)
        self.placement = placement
        # admission: holds requests while no endpoint has room (on by default)
        self.flow = flow or FlowController(FlowControlConfig(), metrics)
        self.flow.follow(datastore)
        # request traces (epp serve --tracing); None: none, and no trace objects at all
        self.tracer = tracer
        # a streamed response silent this long after its first byte is ended by the EPP
        # (where the response body passes it; 0: never; epp.extproc.stall)
        self.stream_chunk_timeout_s = stream_chunk_timeout_s
        # the conformance suite's served-endpoint echo (epp.extproc.conformance)
        self.echo_served_endpoint = echo_served_endpoint
        self._routed = metrics.requests.labels("routed")
        self._forwarded = metrics.requests.labels("forwarded")
        self._orca_ok = metrics.orca_reports.labels("header", "ok")
        self._orca_malformed = metrics.orca_reports.labels("header", "malformed")

    def resolve(self, request: InferenceRequest, doc: Mapping[str, Any] | None) -> Resolved:
        """The request's model rewritten and checked against the adapter catalogue
        (epp.modelnames); ModelNotFoundError for a model nobody serves."""
        return resolve(self.models, request, doc, self.rng)

    def place(self, request: InferenceRequest) -> InferenceRequest | Awaitable[InferenceRequest]:
        """A request for an adapter (catalogued, or listed by some server) narrowed to
        the servers that hold it; with placement on, after a load when none does (then
        awaitable). Any other request (a base model; an adapter nobody holds, which the
        servers answer 404) as it came."""
        placement, model = self.placement, request.model
        if placement is None or model is None:
            return request
        if not (request.lora_adapter or placement.lists(model)):
            return request
        holders = placement.holders(model)
        if holders:
            return _within(replace(request, lora_adapter=True), holders)
        if request.lora_adapter and placement.cfg.enabled:
            return self._place_after_load(placement, request, model)
        return request

    async def _place_after_load(
        self, placement: AdapterPlacement, request: InferenceRequest, adapter: str
    ) -> InferenceRequest:
        return _within(request, await placement.ensure(adapter))

    def admit(
        self, request: InferenceRequest, size: int, max_destinations: int = 1
    ) -> Routed | Waiting[Routed]:
        """Admission, then routing: route at once when nothing waits and an endpoint has
        room; else shed a sheddable request (when configured), or hold the request in
        flow control until it is its turn and there is room (``Waiting``). Requests
        without a body (GET /v1/models) are never held. Raises the client's error."""
        if request.model is None:
            return self.route(request, max_destinations)
        scheduler = self.scheduler
        flow = self.flow
        band = scheduler.priority(request)
        flow_id = fairness_id(request.headers)
        cfg = flow.cfg
        if not cfg.enabled:  # routing as without flow control: room matters for shedding
            if band < 0 and not scheduler.room(request, self.datastore.snapshot()):
                raise _shed(band, cfg.retry_after_s)
            routed = self._dispatch(request, max_destinations, band, 0.0, True, None)
            assert isinstance(routed, Routed)
            flow.observe(flow_id, band, DISPATCHED, 0.0)
            return routed
        if flow.idle:
            room = scheduler.room(request, self.datastore.snapshot())
            if room:  # late binding: only where there is room (or held for its home)
                routed = self._dispatch(request, max_destinations, band, 0.0, room, flow_id)
                if isinstance(routed, Routed):
                    flow.observe(flow_id, band, DISPATCHED, 0.0)
                    return routed
            elif band < 0 and cfg.shed_sheddable:
                raise _shed(band, cfg.retry_after_s)
        elif (
            band < 0
            and cfg.shed_sheddable
            and not scheduler.room(request, self.datastore.snapshot())
        ):
            raise _shed(band, cfg.retry_after_s)
        try:
            limit_s = queue_timeout(request.headers, cfg)
        except ValueError as exc:
            raise BadRequestError(str(exc), code="invalid_queue_timeout") from None
        return flow.enqueue(
            request,
            size,
            band,
            flow_id,
            limit_s,
            lambda: self.scheduler.room(request, self.datastore.snapshot()),
            lambda waited, room, held_for, spill: self._dispatch(
                request, max_destinations, band, waited, room, flow_id, held_for, spill
            ),
            Routed.release,
        )

    def _dispatch(
        self,
        request: InferenceRequest,
        max_destinations: int,
        band: int,
        waited_s: float,
        room: Room,
        flow_id: str | None,
        held_for: Mapping[str, int] | None = None,
        spill: bool = True,
    ) -> Routed | Hold:
        """Route now where it can run now (``room``: the endpoints with room, all when
        True): to the endpoint the scheduler prefers, or wait for it when it has no
        room (``Hold``; the scheduler's dispatch, ``held_for`` and ``spill`` as
        there), or without ``keepAffinity`` to the best endpoint with room;
        a sheddable request that cannot meet its SLO headers (by the latency model's
        prediction plus the time it already waited) is refused instead. With flow
        control on (``flow_id``), the request counts as its flow's in flight until it
        is released (the fair-share policy reads it)."""
        cfg = self.flow.cfg
        start = time.perf_counter()
        decision = self.scheduler.dispatch(
            request,
            self.datastore.snapshot(),
            room,
            self.rng,
            held_for=held_for,
            # a sheddable request that is shed without room does not wait for its home
            keep_affinity=cfg.keep_affinity and not (band < 0 and cfg.shed_sheddable),
            spill=spill,
        )
        if isinstance(decision, Hold):
            return decision
        routed = self.route(request, max_destinations, decision, start)
        pred = routed.result.prediction
        if (
            band < 0
            and pred is not None
            and pred.meets_slo is not None
            and slo_missed(request, pred.ttft_s + waited_s, pred.tpot_s)
        ):
            routed.release()
            raise ShedError(
                "no endpoint is predicted to meet this sheddable request's latency "
                f"objectives (predicted time to first token {pred.ttft_s + waited_s:.3f}s "
                "with its wait); retry later",
                code="slo_unattainable",
                retry_after_s=self.flow.cfg.retry_after_s,
            )
        if flow_id is not None and self._counts_in_flight:
            self._count_in_flight(flow_id, routed)
        return routed

    @property
    def _counts_in_flight(self) -> bool:
        """Whether the fairness policy reads its flows' requests in flight (fair-share)."""
        return bool(getattr(self.flow.queues.policy, "counts_in_flight", False))

    def _count_in_flight(self, flow_id: str, routed: Routed) -> None:
        queues = self.flow.queues
        queues.started(flow_id)
        then = routed.on_release

        def ended() -> None:
            queues.ended(flow_id)
            if then is not None:
                then()

        routed.on_release = ended

    def route(
        self,
        request: InferenceRequest,
        max_destinations: int = 1,
        result: SchedulingResult | None = None,
        started: float | None = None,
    ) -> Routed:
        """Schedule ``request`` (unless ``result`` is its schedule, begun at
        ``started`` by ``time.perf_counter``); the result names at most
        ``max_destinations`` targets (primary first), as many as the Envoy config can
        use. A disaggregated request whose coordinator defers the decode pick holds a
        pending claim instead of one on its decode endpoint until :meth:`pick_decode`."""
        start = time.perf_counter() if started is None else started
        routed_at = self.clock()
        snapshot = self.datastore.snapshot()
        if result is None:
            result = self.scheduler.schedule(request, snapshot, self.rng)
        if len(result.targets) > max_destinations:
            result = replace(result, targets=result.targets[:max_destinations])
        deferred = None
        if self.defers and result.prefill is not None:
            deferred = DeferredDecode(max_destinations, 0.0)
        elif request.lora_adapter and request.subset is not None:
            # Envoy's retries (a 404, a failure) go down this list: holders only
            targets = with_holders(
                result.targets, request.subset, snapshot.endpoints, snapshot.in_flight,
                max_destinations,
            )  # fmt: skip
            result = replace(result, targets=targets)
        if request.model is None:
            # no body (GET /, /v1/models): it needs an endpoint, but it is no inference
            # request, so it is not a scheduling decision (nor a prefix to remember)
            self._forwarded.inc()
        labels = None
        seconds = 0.0
        if request.model is not None:
            if deferred is None:  # else once the decode endpoint is known
                self._committed(request, result, snapshot)
            seconds = time.perf_counter() - start
            self.metrics.scheduling_seconds.observe(seconds)
            self._routed.inc()
            if result.decision:
                self.metrics.pd_decisions.labels(result.decision).inc()
            labels = self.metrics.llmd.labels_of(request.model, request.headers)
            if deferred is None:
                self.metrics.llmd.routed(*labels, seconds, result.primary.address, result.decision)
            else:
                deferred = replace(deferred, scheduling_s=seconds)
        tokens = request.prompt_tokens + (request.max_tokens or DEFAULT_OUTPUT_TOKENS)
        if deferred is not None:
            ticket = self.datastore.acquire_pending(tokens)
        else:
            ticket = self.datastore.acquire(result.primary.address, tokens)
        routed = Routed(
            result,
            ticket,
            labels=labels,
            routed_at=routed_at,
            streaming=request.stream,
            scheduling_s=seconds,
            deferred=deferred,
            prompt_chars=len(request.prompt) if request.prompt_token_count is None else 0,
            adapter=request.model if request.lora_adapter else None,
        )
        if labels is not None:
            routed.on_release = self.metrics.llmd.started(*labels)
        pred = result.prediction
        if pred is None:
            return routed
        if pred.meets_slo is not None:
            self.metrics.slo_predictions.labels("met" if pred.meets_slo else "missed").inc()
        if result.prefill is not None or request.model is None:
            return routed  # nothing for the latency model to learn from
        routed.dispatch = Dispatch(result.primary.address, self.clock(), pred, request.stream)
        return routed

    def _committed(
        self, request: InferenceRequest, result: SchedulingResult, snapshot: Snapshot
    ) -> None:
        """The request goes to ``result``: plugins and adapter placement learn it."""
        self.scheduler.on_routed(request, result, snapshot)
        if request.lora_adapter and self.placement is not None:
            assert request.model is not None
            self.placement.routed(request.model, result.primary.address)

    def pick_decode(
        self, routed: Routed, request: InferenceRequest, prefilled_on: Endpoint | None
    ) -> Endpoint:
        """Deferred decode selection: the decode endpoint for ``routed`` now that its
        prefill leg is done, from this moment's snapshot, outside ``prefilled_on``, among
        the endpoints with room when some have (never held: its KV is waiting). The
        pending claim moves onto the pick; NoEndpointError (503) when none can decode."""
        deferred = routed.deferred
        assert deferred is not None, "the decode endpoint was chosen up front"
        start = time.perf_counter()
        snapshot = self.datastore.snapshot()
        exclude = frozenset() if prefilled_on is None else frozenset({prefilled_on.address})
        try:
            picked = self._decode_pick(request, snapshot, exclude)
        except NoEndpointError as exc:
            self.metrics.deferred_decodes.labels("none").inc()
            raise NoEndpointError(
                f"no endpoint can decode the request after its prefill leg: {exc.message}",
                code="no_decode_endpoint",
            ) from None
        targets = picked.targets[: deferred.max_destinations]
        first = routed.result.primary
        result = replace(routed.result, targets=targets)
        self.metrics.deferred_decodes.labels("same" if targets[0] == first else "moved").inc()
        routed.result, routed.deferred = result, None
        self._committed(request, result, snapshot)
        if routed.labels is not None:
            seconds = deferred.scheduling_s + time.perf_counter() - start
            self.metrics.llmd.routed(
                *routed.labels, seconds, result.primary.address, result.decision
            )
        pending = routed.ticket
        if not pending.released:  # (released: the request ended meanwhile)
            routed.ticket = self.datastore.acquire(result.primary.address, pending.tokens)
            pending.release()
        return result.primary

    def _decode_pick(
        self, request: InferenceRequest, snapshot: Snapshot, exclude: frozenset[str]
    ) -> SchedulingResult:
        """The decode pick among the endpoints with room, else among all."""
        room = self.scheduler.room(request, snapshot)
        if isinstance(room, frozenset) and room - exclude:
            narrowed = _within(request, room)
            try:
                return self.scheduler.pick_decode(narrowed, snapshot, self.rng, exclude)
            except NoEndpointError:
                pass  # only prefill endpoints have room: any decode endpoint, then
        return self.scheduler.pick_decode(request, snapshot, self.rng, exclude)

    def hand_off(
        self,
        routed: Routed,
        request: InferenceRequest,
        doc: Mapping[str, Any],
        rewritten: bool = False,
    ) -> DecodeLeg | Awaitable[DecodeLeg] | None:
        """The decode leg: from the coordinator when the request is disaggregated, else
        None (the body goes as sent), unless the client sent P/D fields of its own,
        which are dropped, or ``doc`` is a rewritten body (a new model name)."""
        clean = without_pd_fields(doc)
        if clean is None and rewritten:
            clean = dict(doc)
        prefill = routed.result.prefill
        if prefill is None or self.coordinator is None:
            return None if clean is None else DecodeLeg(doc=clean)
        deferred = routed.deferred is not None
        handoff = Handoff(
            request,
            doc if clean is None else clean,
            prefill,
            None if deferred else routed.result.primary,
            routed.result.prefill_fallbacks,
            partial(self.pick_decode, routed, request) if deferred else None,
        )
        return self.coordinator.hand_off(handoff)

    def rejected(self, error: ClientVisibleError, request: InferenceRequest | None = None) -> None:
        """A request answered by the EPP itself with an error (``request``: when it was
        parsed)."""
        self.metrics.requests.labels(str(error.status)).inc()
        model = None if request is None else request.model
        headers = {} if request is None else request.headers
        self.metrics.llmd.failed(
            *self.metrics.llmd.labels_of(model, headers), error.status, ours=True
        )

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

    def answered(self, routed: Routed, status: int, served: str = "") -> None:
        """The model server's response status, once per routed request (``served``:
        the endpoint that answered, when Envoy says): a non-200 counts as an error of
        the request (the llm-d Router's ModelServerError); a request for an adapter
        tells placement whether its server lacked it."""
        if routed.labels is not None and status != 200:
            self.metrics.llmd.failed(*routed.labels, status, ours=False)
        if routed.adapter is not None and self.placement is not None:
            primary = routed.result.primary.address
            self.placement.answered(routed.adapter, primary, status, served)

    def first_byte_seen(self, routed: Routed) -> None:
        """The response body's first bytes passed (a streamed response's first token)."""
        if routed.labels is not None and not routed.first_byte:
            routed.first_byte = True
            seconds = self.clock() - routed.routed_at
            self.metrics.llmd.first_byte(*routed.labels, seconds, routed.streaming)
        dispatch = routed.dispatch
        if dispatch is not None and dispatch.first_byte_at is None:
            dispatch.first_byte_at = self.clock()

    def stalled(self, address: str, served: str) -> None:
        """A streamed response whose server went silent was ended by the EPP: counted,
        and a failure of the server that served it (towards its ejection)."""
        self.metrics.stream_stalls.inc()
        if self.outcomes is not None:
            self.outcomes.failure(served or address, "streamed response stalled", serving=True)

    @property
    def chars_per_token(self) -> float:
        """Characters per engine token, learned from the servers' usage reports: what
        a new request's token estimate divides its prompt by."""
        return self.scheduler.latency.tokens.chars_per_token

    def completed(self, routed: Routed, status: int, served: str, usage: Usage | None) -> None:
        """The whole response passed: count its tokens, learn the prompt's characters
        per token, and let the latency model learn from a success served where it was
        sent (not after a failover)."""
        if usage is not None:
            self.metrics.tokens.labels("prompt").inc(usage.prompt_tokens)
            self.metrics.tokens.labels("completion").inc(usage.completion_tokens)
            self.scheduler.latency.tokens.observe(routed.prompt_chars, usage.prompt_tokens)
        if routed.labels is not None:
            tokens = None
            if usage is not None:
                tokens = (usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens)
            self.metrics.llmd.completed(*routed.labels, self.clock() - routed.routed_at, tokens)
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


def _within(request: InferenceRequest, holders: frozenset[str]) -> InferenceRequest:
    """``request`` picked only among ``holders`` (inside the proxy's subset, if any)."""
    subset = holders if request.subset is None else request.subset & holders
    return replace(request, subset=subset)


def _shed(band: int, retry_after_s: int) -> ShedError:
    return ShedError(
        f"the pool is saturated (no endpoint has room) and this request is "
        f"sheddable (priority {band}); retry later",
        code="shed",
        retry_after_s=retry_after_s,
    )
