"""One /metrics page for the parent and its workers (pure): each process's own
exposition text in, one merged text out, without prometheus_client's multiprocess mode
(which drops custom collectors and ``process_*``).

How each family merges:

* counters, histograms and summaries (requests, streams, scheduling time, scrapes, ...):
  summed per label set over every process;
* gauges of what every worker counts for itself and that add up (in-flight requests,
  open ext_proc streams, flow control's queues, the pool's mean in-flight per
  endpoint): summed;
* gauges of membership and endpoint data (``epp_endpoint*``, the pool's ready count,
  queue and KV averages, the scrape interval): the parent's, which owns that data;
* ``process_*`` and ``python_*``: one series per process, the workers' with a ``worker``
  label (the parent's unlabelled);
* every other gauge (prefix and KV indexes, the latency model, ...): each worker's with
  a ``worker`` label, since workers learn them separately;
* ``*_created`` samples are left out: a group has no one creation time per series.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

WORKER_LABEL = "worker"
SUMMED_GAUGES = frozenset(
    {
        "epp_in_flight_requests",
        "epp_extproc_open_streams",
        "llm_d_epp_flow_control_queue_size",
        "llm_d_epp_flow_control_queue_bytes",
        "llm_d_router_pool_average_running_requests",
        "inference_pool_average_running_requests",
        "inference_objective_running_requests",
    }
)
PARENT_PREFIXES = (
    "epp_endpoint",
    "epp_scrape_interval_seconds",
    "llm_d_router_pool_",
    "inference_pool_",
)
PER_PROCESS_PREFIXES = ("process_", "python_")
_TEXT_TYPES = {"unknown": "untyped"}  # the parser's name -> the 0.0.4 format's
_SUMMED_TYPES = frozenset({"counter", "histogram", "summary", "gaugehistogram"})

Labels = tuple[tuple[str, str], ...]


@dataclass
class _Family:
    name: str
    type: str
    documentation: str
    # (sample name, labels) -> value, in the order first seen
    samples: dict[tuple[str, Labels], float] = field(default_factory=dict)


def kind(name: str, type_: str) -> str:
    """How a family merges: ``sum``, ``parent``, ``per-process`` or ``per-worker``."""
    if name.startswith(PER_PROCESS_PREFIXES):
        return "per-process"
    if type_ in _SUMMED_TYPES or name in SUMMED_GAUGES:
        return "sum"
    if name.startswith(PARENT_PREFIXES):
        return "parent"
    return "per-worker"


def merge(parent: str, workers: Mapping[int, str]) -> str:
    """The parent's exposition text and each worker's (by worker index) as one."""
    families: dict[str, _Family] = {}
    sources: list[tuple[int | None, str]] = [(None, parent), *workers.items()]
    for source, text in sources:
        for metric in text_string_to_metric_families(text):
            how = kind(metric.name, metric.type)
            if (how == "parent" and source is not None) or (how == "per-worker" and source is None):
                continue
            if metric.name.endswith("_created"):
                continue
            family = families.setdefault(
                metric.name, _Family(metric.name, metric.type, metric.documentation)
            )
            for sample in metric.samples:
                if sample.name.endswith("_created"):
                    continue
                labels = dict(sample.labels)
                if source is not None and how in ("per-process", "per-worker"):
                    labels[WORKER_LABEL] = str(source)
                key = (sample.name, tuple(sorted(labels.items())))
                if key in family.samples and how == "sum":
                    family.samples[key] += sample.value
                else:
                    family.samples[key] = sample.value
    return "".join(_render(f) for f in families.values())


def _render(family: _Family) -> str:
    lines = [
        f"# HELP {family.name} {_escape_help(family.documentation)}",
        f"# TYPE {family.name} {_TEXT_TYPES.get(family.type, family.type)}",
    ]
    for (name, labels), value in family.samples.items():
        inner = ",".join(f'{k}="{_escape_label(v)}"' for k, v in labels)
        lines.append(f"{name}{{{inner}}} {_number(value)}" if inner else f"{name} {_number(value)}")
    return "\n".join(lines) + "\n"


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _escape_label(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
