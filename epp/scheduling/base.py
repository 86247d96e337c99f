"""Contracts of the scheduler and its plugins. Everything here is synchronous and free
of I/O: a scheduling cycle is a function of (request, snapshot, clock, rng)."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from epp.flowcontrol.holding import Hold
from epp.scheduling.columns import CandidateView, FloatArray, candidate_view
from epp.scheduling.latency import LatencyModel
from epp.scheduling.roomwatch import RoomWatch
from epp.types import EndpointMetrics, EndpointState, InferenceRequest, SchedulingResult, Snapshot


class Scheduler(Protocol):
    # what requests cost where: the router teaches it from responses
    latency: LatencyModel

    def schedule(
        self, request: InferenceRequest, snapshot: Snapshot, rng: random.Random
    ) -> SchedulingResult:
        """Pick endpoints for ``request`` from ``snapshot``.

        Contract: synchronous and free of I/O; every returned target is one of the
        snapshot's endpoints; raises :class:`epp.errors.NoEndpointError` when none fits.
        """
        ...

    def pick_decode(
        self,
        request: InferenceRequest,
        snapshot: Snapshot,
        rng: random.Random,
        exclude: frozenset[str] = frozenset(),
    ) -> SchedulingResult:
        """Deferred decode selection: the decode endpoints for ``request`` (its targets,
        primary first) once its prefill leg has run, from ``snapshot`` and outside
        ``exclude`` (the endpoint that prefilled). Same contract as :meth:`schedule`."""

    def dispatch(
        self,
        request: InferenceRequest,
        snapshot: Snapshot,
        room: bool | frozenset[str],
        rng: random.Random,
        *,
        held_for: Mapping[str, int] | None = None,
        keep_affinity: bool = True,
        spill: bool = True,
    ) -> SchedulingResult | Hold:
        """Flow control's pick for a request that may go now (``room`` is not False):
        its result, or :class:`Hold` when it should wait for its preferred endpoint
        (epp.flowcontrol.holding; without ``spill``, also instead of going elsewhere)."""
        ...

    def priority(self, request: InferenceRequest) -> int:
        """The request's flow-control band (negative: sheddable)."""
        ...

    def room(
        self, request: InferenceRequest, snapshot: Snapshot, watch: RoomWatch | None = None
    ) -> bool | frozenset[str]:
        """Which endpoints the request may go to can take it now: True (all of them),
        False (none: flow control holds it), or their addresses (it is scheduled among
        them). ``watch``: which endpoints may lack room, kept as their load changed
        (epp.scheduling.roomwatch): the same answer, without a pass over the pool
        while none may."""
        ...

    def on_routed(
        self, request: InferenceRequest, result: SchedulingResult, snapshot: Snapshot
    ) -> None:
        """Called once the request is committed to ``result`` (plugins update state)."""
        ...


# Below this many candidates, a list comprehension beats numpy's per-call overhead
# (bench.decision measures both paths side by side; they cross near 64 on a 2-core VM).
VECTORIZE_FROM = 64


@dataclass(slots=True)
class CycleContext:
    """What every plugin sees during one scheduling cycle.

    ``now`` is the scheduler's clock reading for the cycle; metrics older than
    ``stale_after_s`` count as unknown load. ``cache`` lets plugins share work within
    the cycle (e.g. the prompt's block hashes, computed once for all profiles).
    ``latency`` predicts what a request will cost on an endpoint (plugins only read it;
    the router teaches it from responses).
    """

    request: InferenceRequest
    snapshot: Snapshot
    now: float
    rng: random.Random
    stale_after_s: float = 2.0
    cache: dict[Any, Any] = field(default_factory=dict)
    # candidate lists at least this long are scored with numpy (see ``vectorize``)
    vectorize_from: int = VECTORIZE_FROM
    # the scheduler's per-endpoint latency model (predictions are a read)
    latency: LatencyModel = field(default_factory=LatencyModel)

    def metrics(self, state: EndpointState) -> EndpointMetrics | None:
        """The endpoint's reported load, or None if never reported or stale."""
        m = state.metrics
        if m is None or self.now - m.updated_at > self.stale_after_s:
            return None
        return m

    def fresh_metrics(self, candidates: Sequence[EndpointState]) -> list[EndpointMetrics | None]:
        """:meth:`metrics` for each candidate, computed once per candidate list per cycle
        (every scorer of a profile sees the same list)."""
        key = ("fresh", id(candidates))
        cached = self.cache.get(key)
        if cached is None or cached[0] is not candidates:
            limit = self.now - self.stale_after_s
            values = [
                m if m is not None and m.updated_at >= limit else None
                for m in (s.metrics for s in candidates)
            ]
            cached = (candidates, values)
            self.cache[key] = cached
        result: list[EndpointMetrics | None] = cached[1]
        return result

    def vectorize(self, candidates: Sequence[EndpointState]) -> bool:
        """Whether built-in plugins score ``candidates`` with numpy arrays (one call per
        column) rather than Python lists: numpy's fixed cost per call only pays off for
        many candidates. Both give the same numbers."""
        return len(candidates) >= self.vectorize_from

    def view(self, candidates: Sequence[EndpointState]) -> CandidateView:
        """``candidates`` as rows of the snapshot's metric columns (numpy), computed
        once per candidate list per cycle, with this cycle's staleness bound."""
        key = ("view", id(candidates))
        cached = self.cache.get(key)
        if cached is None or cached.candidates is not candidates:
            cached = candidate_view(self.snapshot, candidates, self.now - self.stale_after_s)
            self.cache[key] = cached
        result: CandidateView = cached
        return result


class Filter(Protocol):
    """Narrows the candidates. Contract: ``candidates`` is read-only (often a tuple
    shared with the snapshot: never mutate it); returns a subset of it (possibly
    empty), preserving the order, as a new list or ``candidates`` itself."""

    def filter(
        self, ctx: CycleContext, candidates: Sequence[EndpointState]
    ) -> Sequence[EndpointState]: ...


class Scorer(Protocol):
    """Rates each candidate. Contract: returns one score per candidate, in order, as a
    list or a 1-d numpy array; the framework clamps every score to [0, 1] (1 = best;
    NaN counts 0) before weighting."""

    def score(
        self, ctx: CycleContext, candidates: Sequence[EndpointState]
    ) -> Sequence[float] | FloatArray: ...


class Picker(Protocol):
    """Chooses among scored candidates. Contract: returns 1..max_targets distinct
    endpoints from ``scored`` (best first; the rest are fallbacks), or [] if empty."""

    def pick(
        self, ctx: CycleContext, scored: Sequence[tuple[EndpointState, float]]
    ) -> list[EndpointState]: ...


class ScoresPicker(Protocol):
    """A picker that also takes the totals as one numpy array (what the built-in
    max-score picker does, to skip building 1,000 pairs). Optional: a profile calls
    ``pick_scores`` when the picker has it, else :meth:`Picker.pick`."""

    def pick_scores(
        self, ctx: CycleContext, candidates: Sequence[EndpointState], totals: FloatArray
    ) -> list[EndpointState]: ...


class ProfileRunner(Protocol):
    """What a profile handler runs: one profile (filters -> scorers -> picker)."""

    @property
    def name(self) -> str: ...

    def run(
        self, ctx: CycleContext, candidates: Sequence[EndpointState]
    ) -> list[EndpointState]: ...


class ProfileHandler(Protocol):
    """Decides which profiles run for a request, in which order, and turns their picks
    into the result. Contract: the result's targets are endpoints of ``candidates``;
    raise :class:`epp.errors.NoEndpointError` when the request cannot be served.
    (The single-profile handler runs the first profile; a P/D handler runs ``decode``,
    then asks a decider whether to run ``prefill``.)"""

    def run(
        self,
        ctx: CycleContext,
        profiles: Sequence[ProfileRunner],
        candidates: Sequence[EndpointState],
    ) -> SchedulingResult: ...


@runtime_checkable
class DecodePicker(Protocol):
    """A profile handler that knows which of its profiles picks decode endpoints, for
    deferred decode selection (the P/D handler); without it the first profile does."""

    def run_decode(
        self,
        ctx: CycleContext,
        profiles: Sequence[ProfileRunner],
        candidates: Sequence[EndpointState],
    ) -> list[EndpointState]: ...


@runtime_checkable
class RoutingObserver(Protocol):
    """A plugin with state to update once a request is routed (e.g. the prefix index).
    Called by the router after scheduling, outside the pure cycle."""

    def on_routed(
        self, request: InferenceRequest, result: SchedulingResult, snapshot: Snapshot
    ) -> None: ...


@runtime_checkable
class ReferencesPlugins(Protocol):
    """A plugin that names other plugins or profiles in its parameters (e.g. the P/D
    handler names its profiles and the prefix-cache scorer its decider consults).
    ``bind`` is called once after every plugin is built; it raises
    :class:`epp.common.params.ConfigError` for a name that does not resolve."""

    def bind(self, plugins: Mapping[str, Any], profiles: Sequence[str]) -> None: ...
