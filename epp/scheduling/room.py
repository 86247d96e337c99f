"""Which endpoints have room for one more request (flow control's admission signal,
epp.flowcontrol.saturation): judged on the scheduler's candidates, with the latency
model's slots and the snapshot's numpy columns, so it lives beside them (pure)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from itertools import compress

import numpy as np

from epp.flowcontrol.saturation import Room, SaturationConfig
from epp.scheduling.base import VECTORIZE_FROM
from epp.scheduling.columns import ROLES, candidate_view
from epp.scheduling.latency import LatencyModel
from epp.types import EndpointState, Role, Snapshot

PREFILL_CODE = ROLES.index(Role.PREFILL)


def room(
    snapshot: Snapshot,
    candidates: Sequence[EndpointState],
    cfg: SaturationConfig,
    latency: LatencyModel,
    now: float,
    stale_after_s: float,
    vectorize_from: int = VECTORIZE_FROM,
) -> Room:
    """Which of ``candidates`` (prefill-only endpoints aside) can take a request now:
    its in-flight count under its limit (until its slots are known, the running count
    it reports while requests wait in its queue), and its fresh report (if any) under
    the queue and KV thresholds. An endpoint with neither a limit nor a fresh report has
    room: nothing says it is full. With no such endpoint at all, True: nothing to wait
    for (scheduling answers the error). A set of addresses includes the prefill-only
    candidates (not judged here: a disaggregated request needs them). From
    ``vectorize_from`` candidates on, the same rule on the snapshot's numpy columns."""
    if len(candidates) >= vectorize_from:
        return _room_view(snapshot, candidates, cfg, latency, now - stale_after_s)
    in_flight = snapshot.in_flight.get
    fixed = cfg.max_concurrency
    model = latency.endpoint
    queue, kv = cfg.queue_threshold, cfg.kv_threshold
    oldest = now - stale_after_s
    prefill_role = Role.PREFILL
    roomy: list[str] = []
    prefill: list[str] = []  # not judged, kept: a disaggregated pick needs them
    full = 0
    for s in candidates:  # (a hot loop: one pass per request; locals bound above)
        address = s.address
        if s.endpoint.role is prefill_role:
            prefill.append(address)
            continue
        limit = fixed or model(s).reported_slots
        m = s.metrics
        if m is not None and m.updated_at < oldest:
            m = None
        if m is not None:
            waiting = m.waiting or 0.0
            if waiting >= queue or (m.kv_usage or 0.0) >= kv:
                full += 1
                continue
            if limit is None and waiting and m.running:
                # slots not learned yet: it queues beyond these, so these are its slots
                latency.observe_load(s, m)
                limit = int(m.running)
        if limit is not None and in_flight(address, 0) >= limit:
            full += 1
        else:
            roomy.append(address)
    if not full:
        return True
    return frozenset(roomy + prefill) if roomy else False


def _room_view(
    snapshot: Snapshot,
    candidates: Sequence[EndpointState],
    cfg: SaturationConfig,
    latency: LatencyModel,
    stale_before: float,
) -> Room:
    """:func:`room` with numpy over many candidates: the same answer."""
    view = candidate_view(snapshot, candidates, stale_before)
    prefill = view.columns.roles[view.rows] == PREFILL_CODE
    # NaN (unreported or stale) compares False: no report says full, none teaches slots
    waiting = view.metric("waiting")
    with np.errstate(invalid="ignore"):
        reported_full = (waiting >= cfg.queue_threshold) | (
            view.metric("kv_usage") >= cfg.kv_threshold
        )
        if cfg.max_concurrency:
            limit = np.full(len(candidates), float(cfg.max_concurrency))
        else:  # slots not learned yet: a report of waiting requests makes running the limit
            limit = latency.reported_slots_view(view)
            running = view.metric("running")
            learn = (limit == 0) & (waiting > 0) & (running >= 1)
            if learn.any():  # rare: these are its slots (room learns them, as scheduling)
                for i in np.flatnonzero(learn).tolist():
                    latency.observe_load(candidates[i], candidates[i].metrics)
                limit = np.where(learn, np.floor(running), limit)
    full = ~prefill & (reported_full | ((limit > 0) & (view.counts(snapshot.in_flight) >= limit)))
    if not full.any():
        return True
    roomy = ~full
    if not (roomy & ~prefill).any():
        return False
    return frozenset(compress(view.addresses, roomy.tolist()))


def needs_pass(
    state: EndpointState,
    in_flight: int,
    cfg: SaturationConfig,
    latency: LatencyModel,
    oldest: float,
) -> bool:
    """Whether :func:`room`'s pass would do more with this endpoint than count it as
    having room: count it full (its in-flight count at its limit, or a report fresher
    than ``oldest`` over a threshold), or learn its slots from that report. A
    prefill-only endpoint is never full, but the numpy path learns its slots too.
    (Both paths of :func:`room` find no endpoint full and learn nothing when this is
    False for every candidate.)"""
    limit = cfg.max_concurrency or latency.endpoint(state).reported_slots
    m = state.metrics
    if m is not None and m.updated_at < oldest:
        m = None  # stale: as if unreported
    if state.endpoint.role is Role.PREFILL:
        return m is not None and limit is None and bool(m.waiting) and bool(m.running)
    if m is not None:
        waiting = m.waiting or 0.0
        if waiting >= cfg.queue_threshold or (m.kv_usage or 0.0) >= cfg.kv_threshold:
            return True
        if limit is None and waiting and m.running:
            return True
    return limit is not None and in_flight >= limit


class RoomWatch:
    """The endpoints :func:`room` has to look at, kept between requests, so that the
    common case (every endpoint has room) is answered without a pass over the pool.

    Whoever owns the datastore calls :meth:`changed` when an endpoint's in-flight count
    or report changes; :meth:`quiet` judges again (:func:`needs_pass`) only those
    endpoints, and the ones that needed the pass last time (a report may have gone
    stale since), and the whole pool when membership, the scheduler (its thresholds) or
    the slots the latency model knows changed. What is not judged again has not changed but
    for its report's age, and a report growing stale can only give an endpoint room."""

    __slots__ = ("_changed", "_marked", "_owner", "_version")

    def __init__(self) -> None:
        self._owner: object = None  # the scheduler whose thresholds judged the pool
        # the membership they were judged in (Snapshot.version), and the latency
        # model's slots then (LatencyModel.slots_version)
        self._version = (-1, -1)
        self._changed: set[str] = set()
        self._marked: set[str] = set()  # the endpoints the pass has to look at

    @property
    def marked(self) -> frozenset[str]:
        """The endpoints the last :meth:`quiet` found the pass has to look at."""
        return frozenset(self._marked)

    def changed(self, address: str) -> None:
        """``address``'s in-flight count or report changed."""
        self._changed.add(address)

    def quiet(
        self,
        owner: object,
        snapshot: Snapshot,
        subset: Collection[str] | None,
        cfg: SaturationConfig,
        latency: LatencyModel,
        oldest: float,
    ) -> bool:
        """True when no endpoint of the pool (of ``subset``, if given) needs the pass:
        :func:`room` would answer True and learn nothing. ``owner``: the scheduler
        whose ``cfg`` and ``latency`` these are."""
        in_flight = snapshot.in_flight
        version = (snapshot.version, latency.slots_version)
        if owner is not self._owner or version != self._version:
            self._owner, self._version = owner, version
            self._changed.clear()
            self._marked = {
                s.address
                for s in snapshot.endpoints
                if needs_pass(s, in_flight.get(s.address, 0), cfg, latency, oldest)
            }
        elif self._changed or self._marked:
            judged = self._changed | self._marked
            self._changed.clear()
            marked = self._marked = set()
            for address in judged:
                state = snapshot.state(address)
                if state is not None and needs_pass(
                    state, in_flight.get(address, 0), cfg, latency, oldest
                ):
                    marked.add(address)
        marked = self._marked
        if not marked:
            return True
        return subset is not None and marked.isdisjoint(subset)
