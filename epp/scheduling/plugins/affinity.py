"""Scorers for affinity that is not load: ORCA metrics, sessions (LoRA: lora.py)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from epp.common.params import Params
from epp.scheduling.base import CycleContext
from epp.types import EndpointState, InferenceRequest, SchedulingResult, Snapshot


class OrcaScorer:
    """Score = 1 - an ORCA utilisation-like value in [0, 1] (``metric``: a report key
    such as ``application_utilization`` or ``named_metrics.kv_cache_usage_perc``).
    Endpoints without that value (or stale) score 0."""

    def __init__(self, metric: str) -> None:
        self.metric = metric

    def score(self, ctx: CycleContext, candidates: Sequence[EndpointState]) -> list[float]:
        out = []
        for s in candidates:
            m = ctx.metrics(s)
            value = None if m is None else m.orca.get(self.metric)
            out.append(0.0 if value is None else 1.0 - value)
        return out


def orca_scorer(p: Params) -> OrcaScorer:
    return OrcaScorer(p.string("metric", "application_utilization"))


class SessionAffinityScorer:
    """Sends requests carrying the same session header value to the endpoint the
    session last went to (score 1 there, 0 elsewhere). Remembers ``maxSessions``
    sessions, least recently used forgotten first."""

    def __init__(self, header: str, max_sessions: int) -> None:
        self.header = header.lower()
        self.max_sessions = max_sessions
        self._sessions: OrderedDict[str, str] = OrderedDict()

    def score(self, ctx: CycleContext, candidates: Sequence[EndpointState]) -> list[float]:
        session = ctx.request.headers.get(self.header)
        target = self._sessions.get(session) if session else None
        return [1.0 if s.address == target else 0.0 for s in candidates]

    def on_routed(
        self, request: InferenceRequest, result: SchedulingResult, snapshot: Snapshot
    ) -> None:
        session = request.headers.get(self.header)
        if not session:
            return
        self._sessions[session] = result.primary.address
        self._sessions.move_to_end(session)
        while len(self._sessions) > self.max_sessions:
            self._sessions.popitem(last=False)


def session_affinity_scorer(p: Params) -> SessionAffinityScorer:
    return SessionAffinityScorer(
        p.string("header", "x-session-id"), p.integer("maxSessions", 100_000, minimum=1)
    )
