"""A model server's ``/metrics`` page (Prometheus text) -> :class:`EndpointMetrics`.

Pure: no I/O; the caller passes the clock reading. Parsing is prometheus_client's; this
module only picks the lines it needs first. A vLLM page is mostly histograms (~70 KB,
~700 lines), which prometheus_client's parser reads in ~15 ms: at 20 scrapes a second
that is a third of a core per endpoint. Only lines whose metric name is one the engine
needs are handed to the parser (~0.3 ms for the same page), so a malformed line of
some *other* metric goes unnoticed; a malformed line of ours raises, and so does a page
with none of the engine's metrics (garbage, an HTML error page, or the wrong engine).

Aggregation over label sets (several ``model_name`` or ``engine`` series):

* ``waiting`` and ``running`` are summed;
* ``kv_usage`` (a fraction) is averaged, from the first candidate name present;
* LoRA state comes from the ``lora_info`` series with the newest value (a timestamp);
* cache geometry from the first ``cache_config`` series, its labels read as integers
  (a missing or non-integer label, e.g. ``"None"``, leaves the field None);
* the prefix-cache counters (``prefix_queries``, ``prefix_hits``) are summed;
* the process start time (``start_time``) is the newest sample's.

A metric absent from the page stays None (never 0).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from functools import lru_cache

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from epp.datalayer.engines import EngineMetricNames
from epp.errors import InternalError
from epp.types import EndpointMetrics

# label names of vLLM's lora_requests_info
RUNNING_LORA_LABEL = "running_lora_adapters"
WAITING_LORA_LABEL = "waiting_lora_adapters"
MAX_LORA_LABEL = "max_lora"


class MetricsParseError(InternalError, ValueError):
    """A ``/metrics`` page that cannot be read; the message says why."""


def parse_metrics(text: str, engine: EngineMetricNames, now: float) -> EndpointMetrics:
    """The load ``text`` reports, read with ``engine``'s metric names, dated ``now``.

    Raises MetricsParseError if the lines with the engine's metrics are malformed, carry
    a non-finite value, or if there are none at all.
    """
    lines = _select_lines(text, engine)
    started = _line_prefixes_of(engine.start_time)
    if all(line.startswith(started) for line in lines):  # none of the engine's own
        raise MetricsParseError(
            f"no {engine.engine} metrics in the text (looked for "
            f"{', '.join(engine.metric_names)}): not Prometheus text, or not a "
            f"{engine.engine} server"
        )
    samples = _parse(lines)
    lora_running: frozenset[str] = frozenset()
    lora_waiting: frozenset[str] = frozenset()
    max_lora: int | None = None
    if engine.lora_info is not None and engine.lora_info in samples:
        # one series per state change; the value is when it was recorded
        newest = max(samples[engine.lora_info], key=lambda s: s.value).labels
        lora_running = _adapters(newest.get(RUNNING_LORA_LABEL, ""))
        lora_waiting = _adapters(newest.get(WAITING_LORA_LABEL, ""))
        max_lora = _int_label(newest, MAX_LORA_LABEL, minimum=0)
    block_size: int | None = None
    num_blocks: int | None = None
    if engine.cache_config is not None and engine.cache_config in samples:
        labels = samples[engine.cache_config][0].labels
        block_size = _int_label(labels, engine.block_size_label, minimum=1)
        num_blocks = _int_label(labels, engine.num_blocks_label, minimum=1)
    return EndpointMetrics(
        updated_at=now,
        waiting=_sum(samples.get(engine.waiting)),
        running=_sum(samples.get(engine.running)),
        kv_usage=_kv_usage(samples, engine.kv_usage),
        lora_running=lora_running,
        lora_waiting=lora_waiting,
        max_lora=max_lora,
        block_size=block_size,
        num_blocks=num_blocks,
        prefix_cache_queries=_optional_sum(samples, engine.prefix_queries),
        prefix_cache_hits=_optional_sum(samples, engine.prefix_hits),
        started_at=_newest(samples, engine.start_time),
    )


@lru_cache(maxsize=32)
def _line_prefixes(engine: EngineMetricNames) -> tuple[str, ...]:
    """The lines to parse: the engine's metrics and its start time."""
    names = (*engine.metric_names, engine.start_time)
    return tuple(p for name in names for p in _line_prefixes_of(name))


def _line_prefixes_of(name: str | None) -> tuple[str, ...]:
    """A sample line starts with its name, then labels or whitespace before the value."""
    return () if name is None else tuple(name + sep for sep in ("{", " ", "\t"))


def _select_lines(text: str, engine: EngineMetricNames) -> list[str]:
    prefixes = _line_prefixes(engine)
    # "\n" only: str.splitlines() would also split inside label values
    return [line for line in text.split("\n") if line.startswith(prefixes)]


def _parse(lines: Sequence[str]) -> dict[str, list[Sample]]:
    """Samples by name; MetricsParseError naming the first bad line."""
    try:
        families = list(text_string_to_metric_families("\n".join(lines) + "\n"))
    except (ValueError, LookupError, TypeError) as exc:
        raise MetricsParseError(_first_bad_line(lines, exc)) from exc
    samples: dict[str, list[Sample]] = {}
    for family in families:
        for sample in family.samples:
            if not math.isfinite(sample.value):
                raise MetricsParseError(
                    f"{sample.name}{_labels_text(sample.labels)} has the non-finite "
                    f"value {sample.value}"
                )
            samples.setdefault(sample.name, []).append(sample)
    return samples


def _first_bad_line(lines: Sequence[str], exc: BaseException) -> str:
    """Find which line the parser choked on (error path only: one parse per line)."""
    for line in lines:
        try:
            list(text_string_to_metric_families(line + "\n"))
        except (ValueError, LookupError, TypeError) as line_exc:
            return f"malformed line {_excerpt(line)}: {_reason(line_exc)}"
    return f"malformed Prometheus text: {_reason(exc)}"


def _sum(samples: Sequence[Sample] | None) -> float | None:
    if not samples:
        return None
    return math.fsum(s.value for s in samples)


def _optional_sum(samples: Mapping[str, Sequence[Sample]], name: str | None) -> float | None:
    return None if name is None else _sum(samples.get(name))


def _newest(samples: Mapping[str, Sequence[Sample]], name: str | None) -> float | None:
    series = None if name is None else samples.get(name)
    return max(s.value for s in series) if series else None


def _kv_usage(samples: Mapping[str, Sequence[Sample]], names: Sequence[str]) -> float | None:
    for name in names:
        series = samples.get(name)
        if series:
            return math.fsum(s.value for s in series) / len(series)
    return None


def _adapters(value: str) -> frozenset[str]:
    """``"a,b"`` -> {"a", "b"}; the empty string means none."""
    return frozenset(name for part in value.split(",") if (name := part.strip()))


def _int_label(labels: Mapping[str, str], name: str, *, minimum: int) -> int | None:
    raw = labels.get(name, "").strip()
    if not (raw.isascii() and raw.isdigit()):  # int() would also take "1_0" and "+1"
        return None
    value = int(raw)
    return value if value >= minimum else None


def _labels_text(labels: Mapping[str, str]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def _reason(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def _excerpt(text: str, limit: int = 80) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")
