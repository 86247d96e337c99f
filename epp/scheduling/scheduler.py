"""The configured scheduler: subset hint -> profile -> targets; and the admission
questions flow control asks it (a request's priority, whether the pool has room)."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property

from epp.errors import NoEndpointError
from epp.flowcontrol.holding import Hold, with_held
from epp.flowcontrol.saturation import AdmissionConfig, Room, SaturationConfig, request_priority
from epp.scheduling.base import (
    VECTORIZE_FROM,
    CycleContext,
    DecodePicker,
    ProfileHandler,
    ProfileRunner,
    RoutingObserver,
)
from epp.scheduling.deciders import CachedTokens, uncached_tokens
from epp.scheduling.latency import UNCACHED_KEY, LatencyModel, slo_missed
from epp.scheduling.plugins.precise import PrecisePrefixCacheScorer
from epp.scheduling.plugins.prefix import PrefixCacheScorer
from epp.scheduling.profile import Profile
from epp.scheduling.room import room
from epp.scheduling.roomwatch import RoomWatch
from epp.types import EndpointState, InferenceRequest, Prediction, SchedulingResult, Snapshot


def _within(request: InferenceRequest, room: frozenset[str]) -> InferenceRequest:
    """``request`` picked only among the endpoints with room (in its subset, if any)."""
    return replace(request, subset=room if request.subset is None else room & request.subset)


def _candidates(request: InferenceRequest, snapshot: Snapshot) -> tuple[EndpointState, ...]:
    """The pool, narrowed to the proxy's subset hint (none of it in the pool: 503)."""
    candidates = snapshot.endpoints
    if request.subset is not None:
        candidates = tuple(s for s in candidates if s.address in request.subset)
        if not candidates:
            raise NoEndpointError(
                "no endpoint of the proxy's subset hint "
                f"({', '.join(sorted(request.subset)) or 'empty'}) is in the pool",
                code="no_endpoint_in_subset",
            )
    return candidates


class SingleProfileHandler:
    """Runs the first (usually the only) profile; its picks are the targets."""

    def run(
        self,
        ctx: CycleContext,
        profiles: Sequence[ProfileRunner],
        candidates: Sequence[EndpointState],
    ) -> SchedulingResult:
        targets = profiles[0].run(ctx, candidates)
        return SchedulingResult(tuple(t.endpoint for t in targets))


@dataclass
class ProfileScheduler:
    """Subset hint -> the profile handler. Pure except for plugins' routing observers,
    which the router calls after a request is routed."""

    profiles: Sequence[Profile]
    handler: ProfileHandler
    saturation: SaturationConfig
    admission: AdmissionConfig
    stale_after_s: float
    clock: Callable[[], float]
    observers: Sequence[RoutingObserver] = ()
    # every configured plugin by name (for reporting, e.g. the prefix index's size)
    plugins: Mapping[str, object] = field(default_factory=dict)
    # candidate lists this long or longer are scored with numpy (CycleContext.vectorize)
    vectorize_from: int = VECTORIZE_FROM
    # what a request will cost where: plugins read it, the router teaches it
    latency: LatencyModel = field(default_factory=LatencyModel)
    # objective name -> priority from InferenceObjectives (kept live by discovery, kept
    # across config reloads); the config's ``admission.objectives`` win over it
    objectives: Mapping[str, int] = field(default_factory=dict)
    _latency_version: int = field(default=-1, init=False, repr=False)

    def schedule(
        self, request: InferenceRequest, snapshot: Snapshot, rng: random.Random
    ) -> SchedulingResult:
        ctx = self._context(request, snapshot, rng)
        candidates = _candidates(request, snapshot)
        result = self.handler.run(ctx, self.profiles, candidates)
        return replace(result, prediction=self._predict(ctx, result))

    def pick_decode(
        self,
        request: InferenceRequest,
        snapshot: Snapshot,
        rng: random.Random,
        exclude: frozenset[str] = frozenset(),
    ) -> SchedulingResult:
        """The decode profile alone (the handler's, else the first), a cycle of its own
        over the candidates outside ``exclude`` (deferred decode selection)."""
        ctx = self._context(request, snapshot, rng)
        candidates = [s for s in _candidates(request, snapshot) if s.address not in exclude]
        handler = self.handler
        if isinstance(handler, DecodePicker):
            picks = handler.run_decode(ctx, self.profiles, candidates)
        else:
            picks = self.profiles[0].run(ctx, candidates)
        return SchedulingResult(tuple(s.endpoint for s in picks))

    def dispatch(
        self,
        request: InferenceRequest,
        snapshot: Snapshot,
        room: Room,
        rng: random.Random,
        *,
        held_for: Mapping[str, int] | None = None,
        keep_affinity: bool = True,
        spill: bool = True,
    ) -> SchedulingResult | Hold:
        """Flow control's pick for a request that may go now (``room``: the endpoints
        with room, True for all; epp.flowcontrol.holding): its pick over every endpoint
        it may go to, the requests held ahead of it counted where they wait
        (``held_for``: address -> requests); if that endpoint has no room, with
        ``keep_affinity`` :class:`Hold` (it waits for it) while the latency model
        predicts it sooner there than on the best endpoint with room, else the best
        endpoint with room; without ``spill``, :class:`Hold` then (asked again once
        the requests behind it had their preferred endpoints)."""
        if room is True:
            return self.schedule(request, snapshot, rng)
        assert room  # a frozenset of addresses (flow control holds requests without)
        if keep_affinity:
            ahead = with_held(snapshot, held_for)
            home = self.schedule(request, ahead, rng)
            address = home.primary.address
            state = snapshot.state(address)
            if address in room or state is None:
                return home
            metrics = state.metrics
            if metrics is not None and self.clock() - metrics.updated_at > self.stale_after_s:
                metrics = None
            pred = home.prediction
            uncached = request.prompt_tokens if pred is None else pred.uncached_tokens
            there = self.latency.predict(
                state,
                metrics,
                ahead.in_flight.get(address, 0),
                uncached,
                self.saturation.max_concurrency,
            )
            if not spill:
                return Hold(address, there.wait_s)
            best = self.schedule(_within(request, room), snapshot, rng)
            if best.prediction is None or there.ttft_s <= best.prediction.ttft_s:
                return Hold(address, there.wait_s)
            return best
        return self.schedule(_within(request, room), snapshot, rng)

    def _context(
        self, request: InferenceRequest, snapshot: Snapshot, rng: random.Random
    ) -> CycleContext:
        return CycleContext(
            request,
            snapshot,
            self.clock(),
            rng,
            self.stale_after_s,
            {},
            self.vectorize_from,
            self.latency,
        )

    def priority(self, request: InferenceRequest) -> int:
        """The request's band (negative: sheddable)."""
        return request_priority(request.headers, self.admission, self.objectives)

    def room(
        self, request: InferenceRequest, snapshot: Snapshot, watch: RoomWatch | None = None
    ) -> Room:
        """Which endpoints the request may go to can take it now (room.py); with a
        ``watch`` kept on the datastore, True at once while none of them may lack it."""
        try:
            candidates = _candidates(request, snapshot)
        except NoEndpointError:
            return True  # scheduling answers the precise error at once
        now = self.clock()
        if watch is not None and watch.quiet(
            self,
            snapshot,
            request.subset,
            self.saturation,
            self.latency,
            now - self.stale_after_s,
        ):
            return True
        return room(
            snapshot,
            candidates,
            self.saturation,
            self.latency,
            now,
            self.stale_after_s,
            self.vectorize_from,
        )

    @cached_property
    def _cache_estimate(self) -> CachedTokens | None:
        """The configured prefix-cache scorer (the precise one first), which estimates
        what each endpoint caches; None without one."""
        for kind in (PrecisePrefixCacheScorer, PrefixCacheScorer):
            for plugin in self.plugins.values():
                if isinstance(plugin, kind):
                    return plugin
        return None

    def _predict(self, ctx: CycleContext, result: SchedulingResult) -> Prediction | None:
        """The latency model's expectation on the primary target, with the uncached
        tokens a latency scorer estimated there (else the prefix-cache scorer's
        estimate, else the whole prompt), and whether it meets the request's SLO
        headers."""
        primary = ctx.snapshot.state(result.primary.address)
        if primary is None:
            return None
        request = ctx.request
        scored = ctx.cache.get(UNCACHED_KEY)
        if scored is not None:
            uncached = scored.get(primary.address, request.prompt_tokens)
        else:
            uncached = uncached_tokens(self._cache_estimate, ctx, primary.address)
        in_flight = ctx.snapshot.in_flight.get(primary.address, 0)
        pred = self.latency.predict(primary, ctx.metrics(primary), in_flight, uncached)
        if request.slo_ttft_ms is None and request.slo_tpot_ms is None:
            return pred
        return replace(pred, meets_slo=not slo_missed(request, pred.ttft_s, pred.tpot_s))

    def on_routed(
        self, request: InferenceRequest, result: SchedulingResult, snapshot: Snapshot
    ) -> None:
        if snapshot.version != self._latency_version:  # membership changed
            self._latency_version = snapshot.version
            self.latency.retain({s.address for s in snapshot.endpoints})
        primary = snapshot.state(result.primary.address)
        if primary is not None:  # what its report says of its slots
            self.latency.observe_load(primary, primary.metrics)
        for observer in self.observers:
            observer.on_routed(request, result, snapshot)
