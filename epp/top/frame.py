"""``epp top``'s numbers: what a running EPP serves (its ``/status`` document and its
``/metrics`` text), sampled twice, becomes one row per endpoint and a pool line.

Pure: no I/O, no clock; the caller dates each sample. Rates are counter deltas between
two samples over the time between them (a counter that went down, e.g. the EPP
restarted, gives no rate rather than a negative one). Load (queue, running, KV cache)
is what the EPP last scraped from each server; the prefix hit rate is the share of
prompt tokens the server found in its prefix cache over the window (vLLM's
``prefix_cache_hits``/``prefix_cache_queries`` counters, through ``/status``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

# metric (sample) names read from the EPP's /metrics (docs/metrics.md)
RESPONSES = "epp_responses_total"  # labels endpoint, status_class
REQUESTS = "epp_requests_total"  # label outcome
ANSWERED = ("routed", "forwarded")  # outcomes that are not the EPP's own error answer
SCHEDULING_SUM = "epp_scheduling_duration_seconds_sum"
SCHEDULING_COUNT = "epp_scheduling_duration_seconds_count"
TTFT_BUCKET = "llm_d_epp_request_ttft_seconds_bucket"
TTFT_QUANTILE = 0.9

Labels = Mapping[str, str]
Series = Mapping[str, tuple[tuple[Labels, float], ...]]  # sample name -> (labels, value)
Keep = Callable[[Labels], bool]  # which series of a metric count


@dataclass(frozen=True)
class Sample:
    at: float  # seconds, any monotonic origin
    status: Mapping[str, Any]  # the /status document
    series: Series  # the /metrics samples


@dataclass(frozen=True)
class EndpointRow:
    address: str
    name: str | None  # the host name it was given by, if any
    role: str
    state: str
    waiting: float | None  # requests queued in the engine, as last scraped
    running: float | None
    kv_usage: float | None  # 0..1
    in_flight: int  # requests the EPP routed there and not yet finished
    rate: float | None  # responses per second over the window
    errors: float | None  # non-2xx responses per second
    hit_rate: float | None  # prefix-cache hit tokens / queried tokens over the window


@dataclass(frozen=True)
class PoolLine:
    endpoints: int
    healthy: int
    in_flight: int
    rate: float | None  # requests per second the EPP saw
    errors: float | None  # of them, answered with an error by the EPP itself
    ttft_p90_s: float | None  # over the window's first-token times
    scheduling_ms: float | None  # mean time to choose endpoints over the window


@dataclass(frozen=True)
class Frame:
    pool: PoolLine
    endpoints: tuple[EndpointRow, ...]
    window_s: float | None  # time between the two samples (None: one sample only)


def parse_exposition(text: str) -> Series:
    """Prometheus text -> samples by name (ValueError if it is not Prometheus text)."""
    series: dict[str, list[tuple[Labels, float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            series.setdefault(s.name, []).append((s.labels, s.value))
    return {name: tuple(values) for name, values in series.items()}


def frame(previous: Sample | None, current: Sample) -> Frame:
    window = current.at - previous.at if previous is not None else None
    if window is not None and window <= 0:
        previous, window = None, None
    before = previous.series if previous is not None else None
    docs = previous.status.get("endpoints", []) if previous is not None else []
    earlier = {d.get("instance"): d for d in docs}
    rows = tuple(
        _endpoint_row(doc, earlier.get(doc.get("instance")), before, current.series, window)
        for doc in current.status.get("endpoints", [])
    )
    pool = PoolLine(
        endpoints=len(rows),
        healthy=sum(1 for r in rows if r.state == "healthy"),
        in_flight=sum(r.in_flight for r in rows),
        rate=_rate(before, current.series, window, REQUESTS, lambda _: True),
        errors=_rate(
            before, current.series, window, REQUESTS, lambda la: la.get("outcome") not in ANSWERED
        ),
        ttft_p90_s=_quantile(before, current.series, TTFT_BUCKET, TTFT_QUANTILE),
        scheduling_ms=_mean_ms(before, current.series),
    )
    return Frame(pool, rows, window)


def _endpoint_row(
    doc: Mapping[str, Any],
    earlier: Mapping[str, Any] | None,
    before: Series | None,
    now: Series,
    window: float | None,
) -> EndpointRow:
    address = str(doc.get("instance", "?"))
    load = doc.get("load") or {}

    def mine(labels: Labels) -> bool:
        return labels.get("endpoint") == address

    def failed(labels: Labels) -> bool:
        return mine(labels) and labels.get("status_class") != "2xx"

    return EndpointRow(
        address=address,
        name=doc.get("name"),
        role=str(doc.get("type", "?")),
        state=str(doc.get("state", "?")),
        waiting=load.get("waiting"),
        running=load.get("running"),
        kv_usage=load.get("kv_cache_usage"),
        in_flight=int(doc.get("in_flight", 0)),
        rate=_rate(before, now, window, RESPONSES, mine),
        errors=_rate(before, now, window, RESPONSES, failed),
        hit_rate=_hit_rate(earlier, doc),
    )


def _total(series: Series, name: str, keep: Keep) -> float | None:
    values = [v for labels, v in series.get(name, ()) if keep(labels)]
    return math.fsum(values) if values else None


def _rate(
    before: Series | None, now: Series, window: float | None, name: str, keep: Keep
) -> float | None:
    if before is None or window is None:
        return None
    total = _total(now, name, keep)
    if total is None:
        return 0.0 if name in now else None  # the family exists: nothing of this kind yet
    delta = total - (_total(before, name, keep) or 0.0)
    return delta / window if delta >= 0 else None


def _hit_rate(earlier: Mapping[str, Any] | None, doc: Mapping[str, Any]) -> float | None:
    def counters(d: Mapping[str, Any] | None) -> tuple[float, float] | None:
        cache = ((d or {}).get("load") or {}).get("prefix_cache")
        if not cache or cache.get("queried_tokens") is None:
            return None
        return float(cache["queried_tokens"]), float(cache.get("hit_tokens") or 0.0)

    now, then = counters(doc), counters(earlier)
    if now is None or then is None:
        return None
    queried, hits = now[0] - then[0], now[1] - then[1]
    return hits / queried if queried > 0 and hits >= 0 else None


def _mean_ms(before: Series | None, now: Series) -> float | None:
    if before is None:
        return None
    count = (_total(now, SCHEDULING_COUNT, _all) or 0.0) - (
        _total(before, SCHEDULING_COUNT, _all) or 0.0
    )
    total = (_total(now, SCHEDULING_SUM, _all) or 0.0) - (
        _total(before, SCHEDULING_SUM, _all) or 0.0
    )
    return 1000.0 * total / count if count > 0 and total >= 0 else None


def _all(_: Labels) -> bool:
    return True


def _quantile(before: Series | None, now: Series, name: str, q: float) -> float | None:
    """The q-quantile of the observations made between the samples, from a histogram's
    cumulative buckets summed over their other labels, interpolated linearly inside
    the bucket it falls in (as Prometheus' histogram_quantile does)."""
    if before is None:
        return None
    buckets = _buckets(now.get(name, ()))
    old = _buckets(before.get(name, ()))
    delta = sorted((le, count - old.get(le, 0.0)) for le, count in buckets.items())
    if not delta or delta[-1][1] <= 0:
        return None
    rank = q * delta[-1][1]
    lower_le, lower_count = 0.0, 0.0
    for le, count in delta:
        if count >= rank:
            if math.isinf(le):
                return lower_le  # above the last finite bucket: its bound is what we know
            inside = count - lower_count
            share = (rank - lower_count) / inside if inside > 0 else 1.0
            return lower_le + (le - lower_le) * share
        lower_le, lower_count = le, count
    return None


def _buckets(samples: Iterable[tuple[Labels, float]]) -> dict[float, float]:
    buckets: dict[float, float] = {}
    for labels, value in samples:
        le = float(labels.get("le", "nan"))
        if not math.isnan(le):
            buckets[le] = buckets.get(le, 0.0) + value
    return buckets
