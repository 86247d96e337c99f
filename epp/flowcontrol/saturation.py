"""Saturation: how full an endpoint is, whether the pool has room for one more request,
and a request's priority (its flow-control band; negative: sheddable).

"Room" is the one admission signal: flow control holds requests while no endpoint has
it, and sheds sheddable ones when asked to (``flowControl.shedSheddable``, or flow
control disabled). An endpoint has room while the EPP's in-flight requests there stay
under its concurrency limit (``maxConcurrency``, else its slots as the latency model
knows them: the ``epp.dev/max-num-seqs`` label, ``latencyModel.maxNumSeqs``, else
learned) and its reported load is under the thresholds below (queue depth, KV cache).
Judged before the servers' own queues build up: with a known limit, a request waits in
the EPP instead of in an engine queue."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import compress
from types import MappingProxyType

import numpy as np

from epp.scheduling.base import VECTORIZE_FROM, CycleContext
from epp.scheduling.columns import ROLES, candidate_view
from epp.scheduling.latency import LatencyModel
from epp.scheduling.sections import setting, setting_factory
from epp.types import EndpointState, Role, Snapshot

PRIORITY_HEADER = "x-gateway-inference-priority"
# the llm-d Router's name first, then the Inference Extension's older alias
OBJECTIVE_HEADERS = ("x-llm-d-inference-objective", "x-gateway-inference-objective")
EMPTY: Mapping[str, int] = MappingProxyType({})


@dataclass(frozen=True)
class SaturationConfig:
    """When an endpoint has room for one more request (docs/flow-control.md).

    Flow control holds requests while no endpoint has room."""

    queue_threshold: float = setting(
        5.0, "queueDepthThreshold", "requests waiting at which an endpoint is full", minimum=1e-9
    )
    kv_threshold: float = setting(
        0.8, "kvCacheUtilThreshold", "KV-cache use (0-1) at which an endpoint is full", minimum=1e-9
    )
    max_concurrency: int | None = setting(
        None,
        "maxConcurrency",
        "requests the EPP keeps on one endpoint; null: its slots (label, maxNumSeqs, learned)",
        minimum=1,
    )


def endpoint_saturation(ctx: CycleContext, state: EndpointState, cfg: SaturationConfig) -> float:
    """max(waiting / queue_threshold, kv / kv_threshold); >= 1 means saturated. An
    endpoint with unknown or stale metrics counts as saturated (1.0): we cannot tell."""
    m = ctx.metrics(state)
    if m is None or (m.waiting is None and m.kv_usage is None):
        return 1.0
    return max((m.waiting or 0.0) / cfg.queue_threshold, (m.kv_usage or 0.0) / cfg.kv_threshold)


PREFILL_CODE = ROLES.index(Role.PREFILL)

# Room for a request: True (every endpoint it may go to has room), False (none has), or
# the addresses of those that have (the pick is made among them)
Room = bool | frozenset[str]


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


@dataclass(frozen=True)
class AdmissionConfig:
    """A request's priority: its flow-control band; a negative one is sheddable.

    A higher band is dispatched first; sheddable ones are the first displaced when the
    queues are full.

    Priority comes from ``x-gateway-inference-priority`` (an integer), else from the
    objective named in ``x-llm-d-inference-objective`` (alias
    ``x-gateway-inference-objective``) via ``objectives``, else via the InferenceObjectives
    watched in the pool's namespace, else ``defaultPriority``."""

    objectives: Mapping[str, int] = setting_factory(
        dict, "objectives", f"{OBJECTIVE_HEADERS[0]} value -> priority"
    )
    default_priority: int = setting(
        0, "defaultPriority", f"priority without {PRIORITY_HEADER} or a known objective"
    )


class WatchedObjectives(dict[str, int]):
    """Objective name -> priority, as watched (Kubernetes' InferenceObjectives): replaced
    whole by :meth:`replace`, which tells the listeners (a ``--workers`` parent passes
    the priorities on to its workers). Read as a plain mapping."""

    def __init__(self) -> None:
        super().__init__()
        self._listeners: list[Callable[[], None]] = []

    def on_change(self, listener: Callable[[], None]) -> None:
        self._listeners.append(listener)

    def replace(self, priorities: Mapping[str, int]) -> bool:
        """Hold exactly ``priorities``; True (and the listeners told) if that changed
        anything. One step between two requests (no await): nobody sees it half done."""
        if priorities == self:
            return False
        self.clear()
        self.update(priorities)
        for listener in self._listeners:
            listener()
        return True


def request_priority(
    headers: Mapping[str, str], cfg: AdmissionConfig, watched: Mapping[str, int] = EMPTY
) -> int:
    """The header's priority, else the named objective's (the config's entry over a
    watched InferenceObjective of the same name), else the default."""
    raw = headers.get(PRIORITY_HEADER)
    if raw is not None:
        try:
            return int(raw.strip())
        except ValueError:
            pass  # a malformed header falls back to the objective / default
    for name in OBJECTIVE_HEADERS:
        objective = headers.get(name)
        if objective is not None:
            if objective in cfg.objectives:
                return cfg.objectives[objective]
            if objective in watched:
                return watched[objective]
    return cfg.default_priority
