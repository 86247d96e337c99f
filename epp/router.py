"""The owner of the request lifecycle, as the Envoy stream sees it: resolve the model,
admit, schedule, hand off to the prefill leg, follow the response, end.

The work is done by parts with one job each (:mod:`epp.lifecycle`): the model resolver,
admission (flow control), picking (scheduling and the claim on the pick), the prefill
hand-off. What anything else learns from a request (metrics, the latency model, the
token ratio, failure ejection, LoRA placement, flow control's in-flight counts, ORCA
load, traces) it learns as an observer on the lifecycle's hooks (``epp.lifecycle.hooks``),
registered where the process is wired (``epp.serving.wiring``)."""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from typing import Any

from epp.common.usage import Usage
from epp.datastore import Datastore
from epp.disagg.coordinators import Coordinator, DecodeLeg
from epp.errors import ClientVisibleError
from epp.flowcontrol.controller import FlowController, Waiting
from epp.lifecycle.admission import Admission
from epp.lifecycle.bus import Hooks
from epp.lifecycle.handoff import PrefillHandoff
from epp.lifecycle.observers import EndpointOutcomes
from epp.lifecycle.picking import Picking
from epp.lifecycle.record import DeferredDecode, Received, Routed
from epp.lifecycle.resolving import ModelResolver
from epp.modelnames import ModelsConfig, Resolved
from epp.observability.metrics import EppMetrics
from epp.scheduling.base import Scheduler
from epp.types import Endpoint, InferenceRequest, SchedulingResult
from epp.xds.eds import EnvoySync

__all__ = ["DeferredDecode", "EndpointOutcomes", "Received", "Routed", "Router", "StreamOptions"]


@dataclass(frozen=True)
class StreamOptions:
    """How the Envoy stream treats each request (what it reads through the router)."""

    max_body_bytes: int
    # headers added to every routed request (e.g. asking vLLM for ORCA load)
    request_headers: tuple[tuple[str, str], ...] = ()
    # a streamed response silent this long after its first byte is ended by the EPP
    # (where the response body passes it; 0: never; epp.extproc.stall)
    stream_chunk_timeout_s: float = 0.0
    # the conformance suite's served-endpoint echo (epp.extproc.conformance)
    echo_served_endpoint: bool = False
    # EDS: whether Envoy has this process's endpoints yet (None: never wait)
    envoy_sync: EnvoySync | None = None


class Router:
    """The lifecycle's owner: composes ``picking`` (whose hooks the observers are on),
    admission through ``flow``, the model ``resolver`` and the prefill hand-off with
    ``coordinator``; ``metrics``: the stream's own counts (streams, requests)."""

    def __init__(
        self,
        picking: Picking,
        flow: FlowController,
        metrics: EppMetrics,
        *,
        resolver: ModelResolver | None = None,
        coordinator: Coordinator | None = None,
        stream: StreamOptions,
    ) -> None:
        self.picking = picking
        self.hooks: Hooks = picking.hooks
        self.metrics = metrics
        self.flow = flow
        flow.follow(picking.datastore)
        self.admission = Admission(picking, flow)
        self.resolver = resolver or ModelResolver(rng=picking.rng)
        self.handoff = PrefillHandoff(coordinator, picking)
        self.coordinator = coordinator
        self.max_body_bytes = stream.max_body_bytes
        self.request_headers = stream.request_headers
        self.stream_chunk_timeout_s = stream.stream_chunk_timeout_s
        self.echo_served_endpoint = stream.echo_served_endpoint
        self.envoy_sync = stream.envoy_sync

    @property
    def datastore(self) -> Datastore:
        return self.picking.datastore

    @property
    def scheduler(self) -> Scheduler:
        return self.picking.scheduler

    @scheduler.setter
    def scheduler(self, scheduler: Scheduler) -> None:
        """A config reload's new scheduler (the next pick uses it)."""
        self.picking.scheduler = scheduler

    @property
    def models(self) -> ModelsConfig:
        return self.resolver.models

    @models.setter
    def models(self, models: ModelsConfig) -> None:
        """A config reload's rewrites and adapter catalogue."""
        self.resolver.models = models

    @property
    def chars_per_token(self) -> float:
        """Characters per engine token, learned from the servers' usage reports: what
        a new request's token estimate divides its prompt by."""
        return self.picking.scheduler.latency.tokens.chars_per_token

    # -- the request path ---------------------------------------------------------------
    def resolve(self, request: InferenceRequest, doc: Mapping[str, Any] | None) -> Resolved:
        """The request's model rewritten and checked against the adapter catalogue
        (epp.modelnames); ModelNotFoundError for a model nobody serves."""
        return self.resolver.resolve(request, doc)

    def place(self, request: InferenceRequest) -> InferenceRequest | Awaitable[InferenceRequest]:
        """A request for a LoRA adapter narrowed to its holders (after a load when
        none holds it and placement is on: then awaitable); any other as it came."""
        return self.resolver.place(request)

    def receive(self, headers: Mapping[str, str], request_id: str) -> Received:
        """A request's exchange, opened at its headers: only when some observer
        follows exchanges (``hooks.exchanges``; the stream asks that first)."""
        received = Received(headers, request_id, self.hooks.new_notes())
        for hook in self.hooks.started:
            hook(received)
        return received

    def admit(
        self,
        request: InferenceRequest,
        size: int,
        max_destinations: int = 1,
        received: Received | None = None,
    ) -> Routed | Waiting[Routed]:
        """Route at once, shed, or hold in flow control (``Waiting``); raises the
        client's error (epp.lifecycle.admission). ``received``: the request's exchange,
        if it has one."""
        if received is None:
            return self.admission.admit(request, size, max_destinations)
        hooks = self.hooks
        for hook in hooks.admitting:
            hook(received, request)
        admitted = self.admission.admit(request, size, max_destinations, received.notes)
        if isinstance(admitted, Waiting):
            for held in hooks.held:
                held(received, request)
        return admitted

    def admitted(self, received: Received, routed: Routed) -> None:
        """The exchange's request is routed (after any wait in flow control)."""
        hooks = self.hooks.admitted
        if hooks:
            priority = self.scheduler.priority(routed.request)
            for hook in hooks:
                hook(received, routed, priority)

    def route(
        self,
        request: InferenceRequest,
        max_destinations: int = 1,
        result: SchedulingResult | None = None,
        started: float | None = None,
    ) -> Routed:
        """Schedule and claim, without admission (epp.lifecycle.picking)."""
        return self.picking.route(request, max_destinations, result, started)

    def pick_decode(
        self, routed: Routed, request: InferenceRequest, prefilled_on: Endpoint | None
    ) -> Endpoint:
        """Deferred decode selection after the prefill leg (epp.lifecycle.picking)."""
        return self.picking.pick_decode(routed, request, prefilled_on)

    def hand_off(
        self,
        routed: Routed,
        request: InferenceRequest,
        doc: Mapping[str, Any],
        rewritten: bool = False,
    ) -> DecodeLeg | Awaitable[DecodeLeg] | None:
        """The decode leg, or None: the body goes as sent (epp.lifecycle.handoff)."""
        return self.handoff.hand_off(routed, request, doc, rewritten)

    def rejected(
        self,
        error: ClientVisibleError,
        request: InferenceRequest | None = None,
        received: Received | None = None,
    ) -> None:
        """A request answered by the EPP itself with an error (``request``: when it was
        parsed; ``received``: its exchange, if it has one)."""
        if received is not None:
            received.refused = (error.status, error.code or error.error_type)
        for hook in self.hooks.rejected:
            hook(error.status, request)

    # -- the response path --------------------------------------------------------------
    def response_headers_seen(self, address: str, headers: Mapping[str, str]) -> None:
        """The response headers of a request routed to ``address``."""
        for hook in self.hooks.response_headers:
            hook(address, headers)

    def first_byte_seen(self, routed: Routed) -> None:
        """The response body's first bytes passed (a streamed response's first token)."""
        if routed.first_byte_at is None:
            routed.first_byte_at = self.picking.clock()
            for hook in self.hooks.first_byte:
                hook(routed)

    def chunk_seen(self, routed: Routed, size: int) -> None:
        """A response body chunk of ``size`` bytes passed."""
        for hook in self.hooks.response_chunk:
            hook(routed, size)

    def completed(self, routed: Routed, status: int, served: str, usage: Usage | None) -> None:
        """The whole response passed (``usage``: what the server counted, if it said)."""
        for hook in self.hooks.response_complete:
            hook(routed, status, served, usage)

    def response_seen(self, address: str, status: int, served: str | None = None) -> None:
        """The response status for a request routed to ``address``. ``served`` is the
        endpoint that answered when Envoy says so (another one: Envoy failed over)."""
        for hook in self.hooks.response_status:
            hook(address, status, served or "")

    def answered(self, routed: Routed, status: int, served: str = "") -> None:
        """The model server's response status, once per routed request (``served``:
        the endpoint that answered, when Envoy says)."""
        for hook in self.hooks.answered:
            hook(routed, status, served)

    def stalled(self, address: str, served: str) -> None:
        """A streamed response whose server went silent was ended by the EPP."""
        for hook in self.hooks.stalled:
            hook(address, served)

    def closed(self, received: Received, status: int, outcome: str) -> None:
        """The exchange's stream ended (``outcome``: how; ``status``: the response's)."""
        for hook in self.hooks.closed:
            hook(received, status, outcome)
