"""Picking: one scheduling cycle over this moment's snapshot, the claim on the pick,
and the deferred decode pick after a prefill leg. The ``picked`` and
``decode_picked`` hooks run here."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from epp.datastore import Datastore
from epp.errors import NoEndpointError
from epp.lifecycle.bus import Hooks
from epp.lifecycle.record import DeferredDecode, Routed
from epp.lora.holdings import with_holders
from epp.scheduling.base import Scheduler
from epp.types import Endpoint, InferenceRequest, SchedulingResult, Snapshot

# Output tokens assumed for in-flight token accounting when a request sets no limit.
DEFAULT_OUTPUT_TOKENS = 256


class Picking:
    """Schedules requests and claims their endpoints. ``scheduler`` is replaced on a
    config reload; ``defers``: the coordinator picks the decode endpoint after the
    prefill leg (deferred decode selection)."""

    def __init__(
        self,
        datastore: Datastore,
        scheduler: Scheduler,
        hooks: Hooks,
        *,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
        defers: bool = False,
    ) -> None:
        self.datastore = datastore
        self.scheduler = scheduler
        self.hooks = hooks
        self.rng = rng or random.Random()
        self.clock = clock
        self.defers = defers

    def route(
        self,
        request: InferenceRequest,
        max_destinations: int = 1,
        result: SchedulingResult | None = None,
        started: float | None = None,
        flow_id: str | None = None,
        notes: list[Any] | None = None,
    ) -> Routed:
        """Schedule ``request`` (unless ``result`` is its schedule, begun at
        ``started`` by ``time.perf_counter``); the result names at most
        ``max_destinations`` targets (primary first), as many as the Envoy config can
        use. A disaggregated request whose coordinator defers the decode pick holds a
        pending claim instead of one on its decode endpoint until :meth:`pick_decode`.
        ``flow_id``: the flow it was admitted under in flow control; ``notes``: its
        exchange's (``Received.notes``), when it has one."""
        start = time.perf_counter() if started is None else started
        hooks = self.hooks
        routed_at = self.clock()
        snapshot = self.datastore.snapshot()
        if result is None:
            for before in hooks.before_scheduling:
                before(request)
            result = self.scheduler.schedule(request, snapshot, self.rng)
        if len(result.targets) > max_destinations:
            result = replace(result, targets=result.targets[:max_destinations])
        defer = self.defers and result.prefill is not None
        if not defer and request.lora_adapter and request.subset is not None:
            # Envoy's retries (a 404, a failure) go down this list: holders only
            targets = with_holders(
                result.targets, request.subset, snapshot.endpoints, snapshot.in_flight,
                max_destinations,
            )  # fmt: skip
            result = replace(result, targets=targets)
        seconds = 0.0
        if request.model is not None:
            # (no body, GET /v1/models: it needs an endpoint, but it is no scheduling
            # decision, nor a prefix to remember)
            if not defer:  # else once the decode endpoint is known
                self.scheduler.on_routed(request, result, snapshot)
            seconds = time.perf_counter() - start
        tokens = request.prompt_tokens + (request.max_tokens or DEFAULT_OUTPUT_TOKENS)
        if defer:
            ticket = self.datastore.acquire_pending(tokens)
        else:
            ticket = self.datastore.acquire(result.primary.address, tokens)
        routed = Routed(
            request,
            result,
            ticket,
            hooks,
            hooks.new_notes() if notes is None else notes,
            flow_id=flow_id,
            routed_at=routed_at,
            sent_at=self.clock(),
            scheduling_s=seconds,
            deferred=DeferredDecode(max_destinations, seconds) if defer else None,
        )
        for hook in hooks.picked:
            hook(routed)
        return routed

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
            for hook in self.hooks.decode_picked:
                hook(routed, None)
            raise NoEndpointError(
                f"no endpoint can decode the request after its prefill leg: {exc.message}",
                code="no_decode_endpoint",
            ) from None
        targets = picked.targets[: deferred.max_destinations]
        moved = targets[0] != routed.result.primary
        result = replace(routed.result, targets=targets)
        routed.result, routed.deferred = result, None
        routed.scheduling_s = deferred.scheduling_s + time.perf_counter() - start
        self.scheduler.on_routed(request, result, snapshot)
        pending = routed.ticket
        if not pending.released:  # (released: the request ended meanwhile)
            routed.ticket = self.datastore.acquire(result.primary.address, pending.tokens)
            pending.release()
        for hook in self.hooks.decode_picked:
            hook(routed, moved)
        return result.primary

    def _decode_pick(
        self, request: InferenceRequest, snapshot: Snapshot, exclude: frozenset[str]
    ) -> SchedulingResult:
        """The decode pick among the endpoints with room, else among all."""
        room = self.scheduler.room(request, snapshot)
        if isinstance(room, frozenset) and room - exclude:
            narrowed = within(request, room)
            try:
                return self.scheduler.pick_decode(narrowed, snapshot, self.rng, exclude)
            except NoEndpointError:
                pass  # only prefill endpoints have room: any decode endpoint, then
        return self.scheduler.pick_decode(request, snapshot, self.rng, exclude)


def within(request: InferenceRequest, holders: frozenset[str]) -> InferenceRequest:
    """``request`` picked only among ``holders`` (inside the proxy's subset, if any)."""
    subset = holders if request.subset is None else request.subset & holders
    return replace(request, subset=subset)
