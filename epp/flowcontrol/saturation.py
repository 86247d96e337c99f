"""Saturation: how full an endpoint is, whether the pool has room for one more request,
and a request's priority (its flow-control band; negative: sheddable).

"Room" is the one admission signal: flow control holds requests while no endpoint has
it, and sheds sheddable ones when asked to (``flowControl.shedSheddable``, or flow
control disabled). An endpoint has room while the EPP's in-flight requests there stay
under its concurrency limit (``maxConcurrency``, else its slots as the latency model
knows them: the ``epp.dev/max-num-seqs`` label, ``latencyModel.maxNumSeqs``, else
learned) and its reported load is under the thresholds below (queue depth, KV cache).
Judged before the servers' own queues build up: with a known limit, a request waits in
the EPP instead of in an engine queue. The judgement over a request's candidates reads
the latency model's slots and the snapshot's columns, so it is the scheduler's
(epp.scheduling.room); this module holds its thresholds and its answer (:data:`Room`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from epp.common.sections import setting, setting_factory
from epp.types import EndpointMetrics

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


def endpoint_saturation(m: EndpointMetrics | None, cfg: SaturationConfig) -> float:
    """max(waiting / queue_threshold, kv / kv_threshold) of an endpoint's fresh metrics
    ``m`` (None: unknown or stale); >= 1 means saturated. An endpoint with unknown or
    stale metrics counts as saturated (1.0): we cannot tell."""
    if m is None or (m.waiting is None and m.kv_usage is None):
        return 1.0
    return max((m.waiting or 0.0) / cfg.queue_threshold, (m.kv_usage or 0.0) / cfg.kv_threshold)


# Room for a request: True (every endpoint it may go to has room), False (none has), or
# the addresses of those that have (the pick is made among them)
Room = bool | frozenset[str]


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
