"""Saturation: how full an endpoint is, whether the pool is, and who gets shed."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from epp.scheduling.base import CycleContext
from epp.scheduling.sections import setting, setting_factory
from epp.types import EndpointState, Role

PRIORITY_HEADER = "x-gateway-inference-priority"
OBJECTIVE_HEADER = "x-gateway-inference-objective"


@dataclass(frozen=True)
class SaturationConfig:
    """When an endpoint counts as saturated (sheddable requests get 429 while the pool is)."""

    queue_threshold: float = setting(
        5.0, "queueDepthThreshold", "requests waiting at which an endpoint is full", minimum=1e-9
    )
    kv_threshold: float = setting(
        0.8, "kvCacheUtilThreshold", "KV-cache use (0-1) at which an endpoint is full", minimum=1e-9
    )


def endpoint_saturation(ctx: CycleContext, state: EndpointState, cfg: SaturationConfig) -> float:
    """max(waiting / queue_threshold, kv / kv_threshold); >= 1 means saturated. An
    endpoint with unknown or stale metrics counts as saturated (1.0): we cannot tell."""
    m = ctx.metrics(state)
    if m is None or (m.waiting is None and m.kv_usage is None):
        return 1.0
    return max((m.waiting or 0.0) / cfg.queue_threshold, (m.kv_usage or 0.0) / cfg.kv_threshold)


def pool_saturated(
    ctx: CycleContext, states: Iterable[EndpointState], cfg: SaturationConfig
) -> bool:
    """The pool is saturated when the mean endpoint saturation is >= 1."""
    values = [
        endpoint_saturation(ctx, s, cfg) for s in states if s.endpoint.role is not Role.PREFILL
    ]
    return bool(values) and sum(values) / len(values) >= 1.0


@dataclass(frozen=True)
class AdmissionConfig:
    """A request's priority; a negative one is sheddable (429 while the pool is saturated).

    Priority comes from ``x-gateway-inference-priority`` (an integer), else from the
    objective named in ``x-gateway-inference-objective`` via ``objectives``, else
    ``defaultPriority``."""

    objectives: Mapping[str, int] = setting_factory(
        dict, "objectives", f"{OBJECTIVE_HEADER} value -> priority"
    )
    default_priority: int = setting(
        0, "defaultPriority", f"priority without {PRIORITY_HEADER} or a known objective"
    )


def request_priority(headers: Mapping[str, str], cfg: AdmissionConfig) -> int:
    raw = headers.get(PRIORITY_HEADER)
    if raw is not None:
        try:
            return int(raw.strip())
        except ValueError:
            pass  # a malformed header falls back to the objective / default
    objective = headers.get(OBJECTIVE_HEADER)
    if objective is not None and objective in cfg.objectives:
        return cfg.objectives[objective]
    return cfg.default_priority
