"""Which endpoints may lack room, kept between requests as their load changes, so that
admission's common case (every endpoint has room) needs no pass over the pool
(room.py): the watch, and the pass's rule for one endpoint (pure)."""

from __future__ import annotations

from collections.abc import Collection

from epp.flowcontrol.saturation import SaturationConfig
from epp.scheduling.latency import LatencyModel
from epp.types import EndpointState, Role, Snapshot


def needs_pass(
    state: EndpointState,
    in_flight: int,
    cfg: SaturationConfig,
    latency: LatencyModel,
    oldest: float,
) -> bool:
    """Whether the pass over the pool (room.py) would do more with this endpoint than
    count it as having room: count it full (its in-flight count at its limit, or a
    report fresher than ``oldest`` over a threshold), or learn its slots from that
    report. A prefill-only endpoint is never full, but the numpy path learns its slots
    too. (Both paths of the pass find no endpoint full and learn nothing when this is
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
    """The endpoints the pass over the pool (room.py) has to look at, kept between
    requests, so that the common case (every endpoint has room) is answered without
    the pass.

    Whoever owns the datastore calls :meth:`changed` when an endpoint's in-flight count
    or report changes; :meth:`quiet` judges again (:func:`needs_pass`) only those
    endpoints, and the ones that needed the pass last time (a report may have gone
    stale since), and the whole pool when membership, the scheduler (its thresholds) or
    the slots the latency model knows changed. What is not judged again has not changed
    but for its report's age, and a report growing stale can only give an endpoint
    room."""

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
        the pass would answer True and learn nothing. ``owner``: the scheduler whose
        ``cfg`` and ``latency`` these are."""
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
