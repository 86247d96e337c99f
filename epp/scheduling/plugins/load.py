"""Scorers on load signals: engine queue, running batch, KV-cache use, and the EPP's
own in-flight accounting (fresh between scrapes)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from epp.common.params import Params
from epp.scheduling.base import CycleContext
from epp.scheduling.columns import FloatArray
from epp.types import EndpointState


def relative(values: Sequence[float | None]) -> list[float]:
    """Min-max score where lower is better: the least loaded gets 1, the most 0, all
    equal gets 1; unknown (None, or a reported NaN) gets 0 so an endpoint we cannot see
    is not preferred."""
    known = [v for v in values if v is not None and v == v]  # v != v: NaN
    if not known:
        return [0.0] * len(values)
    lo, hi = min(known), max(known)
    span = hi - lo
    return [0.0 if v is None or v != v else (1.0 if span == 0 else (hi - v) / span) for v in values]


def against_threshold(values: Sequence[float | None], threshold: float) -> list[float]:
    """Absolute score where lower is better: 1 at 0, falling linearly to 0 at
    ``threshold``; unknown (None) gets 0. Unlike :func:`relative`, one queued request
    costs a little, not everything, so small fluctuations do not flip decisions."""
    return [0.0 if v is None else max(0.0, 1.0 - v / threshold) for v in values]


def relative_array(values: FloatArray) -> FloatArray:
    """:func:`relative` for a numpy array (NaN = unknown); the same numbers."""
    if len(values) == 0:
        return np.zeros(0)
    lo = float(np.fmin.reduce(values))  # fmin/fmax skip NaN unless all are NaN
    if lo != lo:
        return np.zeros(len(values))
    hi = float(np.fmax.reduce(values))
    span = hi - lo
    if not math.isfinite(span):  # infinite load reported: every score is 0 (or NaN) in
        return np.zeros(len(values))  # the list path (inf/inf), and NaN is clamped to 0
    if span == 0:
        ones: FloatArray = (values == values).astype(np.float64)  # known (not NaN) -> 1
        return ones
    result: FloatArray = np.fmax((hi - values) / span, 0.0)  # unknown (NaN) -> 0
    return result


def against_threshold_array(values: FloatArray, threshold: float) -> FloatArray:
    """:func:`against_threshold` for a numpy array (NaN = unknown); the same numbers."""
    result: FloatArray = np.fmax(1.0 - values / threshold, 0.0)  # fmax: NaN -> 0
    return result


class _MetricScorer:
    def __init__(self, field: str, threshold: float | None) -> None:
        self._field = field
        self._threshold = threshold

    def score(
        self, ctx: CycleContext, candidates: Sequence[EndpointState]
    ) -> list[float] | FloatArray:
        if ctx.vectorize(candidates):
            column = ctx.view(candidates).metric(self._field)
            if self._threshold is None:
                return relative_array(column)
            return against_threshold_array(column, self._threshold)
        f = self._field
        values = [None if m is None else getattr(m, f) for m in ctx.fresh_metrics(candidates)]
        if self._threshold is None:
            return relative(values)
        return against_threshold(values, self._threshold)


def _normalization(p: Params) -> float | None:
    mode = p.string("normalize", "relative", choices=("relative", "threshold"))
    threshold = p.number("threshold", 5.0, minimum=1e-9)
    return threshold if mode == "threshold" else None


def queue_scorer(p: Params) -> _MetricScorer:
    """Fewer requests waiting in the engine's queue scores higher: min-max across
    candidates (``normalize: relative``) or ``1 - waiting/threshold``
    (``normalize: threshold``). Consumes: scraped/ORCA ``waiting``."""
    return _MetricScorer("waiting", _normalization(p))


def running_requests_scorer(p: Params) -> _MetricScorer:
    """Smaller running batch scores higher (same normalizations as queue-scorer).
    Consumes: scraped/ORCA ``running``."""
    return _MetricScorer("running", _normalization(p))


class KvCacheScorer:
    """Score = 1 - KV-cache utilisation (absolute, so a nearly full cache scores near 0
    even if every candidate is nearly full). Unknown or stale = 0."""

    def score(
        self, ctx: CycleContext, candidates: Sequence[EndpointState]
    ) -> list[float] | FloatArray:
        if ctx.vectorize(candidates):  # unknown or stale (NaN) -> 0
            return np.fmax(1.0 - ctx.view(candidates).metric("kv_usage"), 0.0)
        return [
            0.0 if m is None or m.kv_usage is None else 1.0 - m.kv_usage
            for m in ctx.fresh_metrics(candidates)
        ]


def kv_cache_scorer(p: Params) -> KvCacheScorer:
    return KvCacheScorer()


class InFlightScorer:
    """The EPP's own count of requests (or estimated tokens) routed to each endpoint and
    not yet finished; min-max, fewer is better. Always fresh, needs no scrape."""

    def __init__(self, unit: str) -> None:
        self.unit = unit

    def score(
        self, ctx: CycleContext, candidates: Sequence[EndpointState]
    ) -> list[float] | FloatArray:
        table = ctx.snapshot.in_flight if self.unit == "requests" else ctx.snapshot.in_flight_tokens
        if ctx.vectorize(candidates):
            return relative_array(ctx.view(candidates).counts(table))
        return relative([float(table.get(s.address, 0)) for s in candidates])


def in_flight_scorer(p: Params) -> InFlightScorer:
    return InFlightScorer(p.string("unit", "requests", choices=("requests", "tokens")))
