"""Which endpoints have room for one more request (flow control's admission signal,
epp.flowcontrol.saturation): judged on the scheduler's candidates, with the latency
model's slots and the snapshot's numpy columns, so it lives beside them (pure)."""

from __future__ import annotations

from collections.abc import Sequence
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
