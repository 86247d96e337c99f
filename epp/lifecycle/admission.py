"""Admission: route at once, shed, or hold a request in flow control until it is its
turn and an endpoint has room; then the scheduler's dispatch decides where."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from epp.errors import BadRequestError, ShedError
from epp.flowcontrol.controller import DISPATCHED, FlowController, Waiting
from epp.flowcontrol.holding import Hold
from epp.flowcontrol.queues import fairness_id, queue_timeout
from epp.flowcontrol.saturation import Room
from epp.lifecycle.picking import Picking
from epp.lifecycle.record import Routed
from epp.scheduling.latency import slo_missed
from epp.scheduling.roomwatch import RoomWatch
from epp.types import InferenceRequest


class Admission:
    """Admits requests through ``flow`` and routes them with ``picking``. Which
    endpoints may lack room is kept as their load changes (``watch``), so a request
    finds the pool with room without a pass over it."""

    def __init__(self, picking: Picking, flow: FlowController) -> None:
        self.picking = picking
        self.flow = flow
        self.watch = watch = RoomWatch()
        datastore = picking.datastore
        datastore.on_load(watch.changed)
        datastore.on_metrics(lambda address, _: watch.changed(address))

    def admit(
        self,
        request: InferenceRequest,
        size: int,
        max_destinations: int = 1,
        notes: list[Any] | None = None,
    ) -> Routed | Waiting[Routed]:
        """Admission, then routing: route at once when nothing waits and an endpoint has
        room; else shed a sheddable request (when configured), or hold the request in
        flow control until it is its turn and there is room (``Waiting``). Requests
        without a body (GET /v1/models) are never held. Raises the client's error.
        ``notes``: the request's exchange's, for its record (None: new ones)."""
        picking = self.picking
        if request.model is None:
            return picking.route(request, max_destinations, notes=notes)
        scheduler = picking.scheduler
        flow = self.flow
        band = scheduler.priority(request)
        flow_id = fairness_id(request.headers)
        cfg = flow.cfg
        if not cfg.enabled:  # routing as without flow control: room matters for shedding
            if band < 0 and not self._room(request):
                raise _shed(band, cfg.retry_after_s)
            routed = self._dispatch(request, max_destinations, band, 0.0, True, None, notes)
            assert isinstance(routed, Routed)
            flow.observe(flow_id, band, DISPATCHED, 0.0)
            return routed
        if flow.idle:
            room = self._room(request)
            if room:  # late binding: only where there is room (or held for its home)
                routed = self._dispatch(request, max_destinations, band, 0.0, room, flow_id, notes)
                if isinstance(routed, Routed):
                    flow.observe(flow_id, band, DISPATCHED, 0.0)
                    return routed
            elif band < 0 and cfg.shed_sheddable:
                raise _shed(band, cfg.retry_after_s)
        elif band < 0 and cfg.shed_sheddable and not self._room(request):
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
            lambda: self._room(request),
            lambda waited, room, held_for, spill: self._dispatch(
                request, max_destinations, band, waited, room, flow_id, notes, held_for, spill
            ),
            Routed.release,
        )

    def _room(self, request: InferenceRequest) -> Room:
        """Which endpoints the request may go to have room now (the scheduler's)."""
        picking = self.picking
        return picking.scheduler.room(request, picking.datastore.snapshot(), self.watch)

    def _dispatch(
        self,
        request: InferenceRequest,
        max_destinations: int,
        band: int,
        waited_s: float,
        room: Room,
        flow_id: str | None,
        notes: list[Any] | None,
        held_for: Mapping[str, int] | None = None,
        spill: bool = True,
    ) -> Routed | Hold:
        """Route now where it can run now (``room``: the endpoints with room, all when
        True): to the endpoint the scheduler prefers, or wait for it when it has no
        room (``Hold``; the scheduler's dispatch, ``held_for`` and ``spill`` as
        there), or without ``keepAffinity`` to the best endpoint with room;
        a sheddable request that cannot meet its SLO headers (by the latency model's
        prediction plus the time it already waited) is refused instead. With flow
        control on, ``flow_id`` names the request's flow in its record (the fair-share
        policy counts the flow's requests in flight from it)."""
        cfg = self.flow.cfg
        picking = self.picking
        start = time.perf_counter()
        for hook in picking.hooks.before_scheduling:
            hook(request)
        decision = picking.scheduler.dispatch(
            request,
            picking.datastore.snapshot(),
            room,
            picking.rng,
            held_for=held_for,
            # a sheddable request that is shed without room does not wait for its home
            keep_affinity=cfg.keep_affinity and not (band < 0 and cfg.shed_sheddable),
            spill=spill,
        )
        if isinstance(decision, Hold):
            return decision
        routed = picking.route(request, max_destinations, decision, start, flow_id, notes)
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
                retry_after_s=cfg.retry_after_s,
            )
        return routed


def _shed(band: int, retry_after_s: int) -> ShedError:
    return ShedError(
        f"the pool is saturated (no endpoint has room) and this request is "
        f"sheddable (priority {band}); retry later",
        code="shed",
        retry_after_s=retry_after_s,
    )
