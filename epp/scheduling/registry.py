"""Plugin registry: type name -> (kind, factory). One explicit registration function;
nothing registers itself at import time."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from epp.scheduling.params import ConfigError, Params
from epp.scheduling.plugins import (
    affinity,
    filters,
    latency,
    load,
    pd,
    pickers,
    precise,
    prefix,
)
from epp.scheduling.scheduler import SingleProfileHandler

Kind = Literal["filter", "scorer", "picker", "handler"]


@dataclass(frozen=True)
class PluginType:
    kind: Kind
    factory: Callable[[Params], Any]
    summary: str


class Registry:
    def __init__(self) -> None:
        self._types: dict[str, PluginType] = {}

    def register(
        self, name: str, kind: Kind, factory: Callable[[Params], Any], summary: str
    ) -> None:
        if name in self._types:
            raise ValueError(f"plugin type {name!r} registered twice")
        self._types[name] = PluginType(kind, factory, summary)

    def get(self, name: str, where: str) -> PluginType:
        try:
            return self._types[name]
        except KeyError:
            raise ConfigError(
                f"{where}: unknown plugin type {name!r}; known types: {sorted(self._types)}"
            ) from None

    def types(self) -> dict[str, PluginType]:
        return dict(self._types)


def single_profile_handler(p: Params) -> SingleProfileHandler:
    return SingleProfileHandler()


def register_builtin_plugins(registry: Registry) -> Registry:
    r = registry.register
    r("decode-filter", "filter", filters.decode_filter, "endpoints that can decode")
    r("prefill-filter", "filter", filters.prefill_filter, "endpoints that can prefill")
    r("role-filter", "filter", filters.role_filter, "endpoints whose role is in `roles`")
    r("label-selector-filter", "filter", filters.label_selector_filter, "by `matchLabels`")
    r("lora-affinity-filter", "filter", filters.lora_capacity_filter, "LoRA capacity")
    r("saturation-filter", "filter", filters.saturation_filter, "drop saturated endpoints")
    r("queue-scorer", "scorer", load.queue_scorer, "shorter engine queue")
    r("running-requests-scorer", "scorer", load.running_requests_scorer, "smaller batch")
    r("kv-cache-utilization-scorer", "scorer", load.kv_cache_scorer, "more free KV cache")
    r("in-flight-load-scorer", "scorer", load.in_flight_scorer, "fewer EPP in-flight")
    r("prefix-cache-scorer", "scorer", prefix.prefix_cache_scorer, "longest cached prefix")
    r(
        "precise-prefix-cache-scorer",
        "scorer",
        precise.precise_prefix_cache_scorer,
        "longest prefix the server reports it holds (KV events)",
    )
    r(
        "predicted-latency-scorer",
        "scorer",
        latency.predicted_latency_scorer,
        "lowest predicted time to first token",
    )
    r("lora-affinity-scorer", "scorer", affinity.lora_affinity_scorer, "adapter loaded")
    r("orca-scorer", "scorer", affinity.orca_scorer, "lower ORCA utilisation")
    r("session-affinity-scorer", "scorer", affinity.session_affinity_scorer, "same session")
    r("single-profile-handler", "handler", single_profile_handler, "run the first profile")
    r("pd-profile-handler", "handler", pd.pd_profile_handler, "decode, then prefill if worth it")
    r("max-score-picker", "picker", pickers.max_score_picker, "best score, random ties")
    r("random-picker", "picker", pickers.random_picker, "uniformly random")
    r("weighted-random-picker", "picker", pickers.weighted_random_picker, "random by score")
    return registry
