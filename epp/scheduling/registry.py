"""Plugin registry: type name -> (kind, factory). One explicit registration function;
nothing registers itself at import time. Installed packages add types through the
``epp.plugins`` entry-point group (:mod:`epp.common.extensions`): each entry point names a
:class:`PluginType`; a built-in type of the same name wins."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from epp.common.extensions import ExtensionError, Installed, instance_of
from epp.common.params import ConfigError, Params
from epp.scheduling.plugins import (
    affinity,
    filters,
    latency,
    load,
    lora,
    pd,
    pickers,
    precise,
    prefix,
    selection,
)
from epp.scheduling.scheduler import SingleProfileHandler

Kind = Literal["filter", "scorer", "picker", "handler"]


@dataclass(frozen=True)
class PluginType:
    kind: Kind
    factory: Callable[[Params], Any]
    summary: str


# the plugin types installed packages add
INSTALLED_PLUGINS: Installed[PluginType] = Installed(
    "epp.plugins", "plugin type", instance_of(PluginType)
)


class Registry:
    """Registered types first, then ``installed`` ones (none unless given)."""

    def __init__(self, installed: Installed[PluginType] | None = None) -> None:
        self._types: dict[str, PluginType] = {}
        self._installed = installed

    def register(
        self, name: str, kind: Kind, factory: Callable[[Params], Any], summary: str
    ) -> None:
        if name in self._types:
            raise ValueError(f"plugin type {name!r} registered twice")
        self._types[name] = PluginType(kind, factory, summary)

    def get(self, name: str, where: str) -> PluginType:
        try:
            return self.types()[name]
        except KeyError:
            known = sorted(self.types())
            raise ConfigError(
                f"{where}: unknown plugin type {name!r}; known types: {known}"
            ) from None
        except ConfigError as exc:  # an installed type that cannot be loaded
            raise ConfigError(f"{where}: {exc}") from None

    def types(self) -> Mapping[str, PluginType]:
        """Every type by name; an installed one is loaded when looked up (ConfigError if
        it cannot be)."""
        return _Types(self._types, self._installed)


class _Types(Mapping[str, PluginType]):
    def __init__(
        self, registered: dict[str, PluginType], installed: Installed[PluginType] | None
    ) -> None:
        self._registered = registered
        self._installed = installed

    def __getitem__(self, name: str) -> PluginType:
        if name in self._registered:
            return self._registered[name]
        if self._installed is None or name not in self._installed.names(self._registered):
            raise KeyError(name)
        try:
            return self._installed.load(name)
        except ExtensionError as exc:
            raise ConfigError(str(exc)) from None

    def __contains__(self, name: object) -> bool:  # without loading anything
        return name in self._names()

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def _names(self) -> list[str]:
        installed = [] if self._installed is None else self._installed.names(self._registered)
        return [*self._registered, *installed]

    def __len__(self) -> int:
        return sum(1 for _ in self)


def single_profile_handler(p: Params) -> SingleProfileHandler:
    return SingleProfileHandler()


def register_builtin_plugins(registry: Registry) -> Registry:
    r = registry.register
    r("decode-filter", "filter", filters.decode_filter, "endpoints that can decode")
    r("prefill-filter", "filter", filters.prefill_filter, "endpoints that can prefill")
    r("role-filter", "filter", filters.role_filter, "endpoints whose role is in `roles`")
    r("label-selector-filter", "filter", filters.label_selector_filter, "by `matchLabels`")
    r("lora-affinity-filter", "filter", lora.lora_affinity_filter, "adapter active, else a slot")
    r("saturation-filter", "filter", filters.saturation_filter, "drop saturated endpoints")
    r(
        "endpoint-selection-header-filter",
        "filter",
        selection.endpoint_selection_header_filter,
        "the endpoints the conformance suite's test header names",
    )
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
    r("lora-affinity-scorer", "scorer", lora.lora_affinity_scorer, "adapter tier, then wait")
    r("orca-scorer", "scorer", affinity.orca_scorer, "lower ORCA utilisation")
    r("session-affinity-scorer", "scorer", affinity.session_affinity_scorer, "same session")
    r("single-profile-handler", "handler", single_profile_handler, "run the first profile")
    r("pd-profile-handler", "handler", pd.pd_profile_handler, "decode, then prefill if worth it")
    r("max-score-picker", "picker", pickers.max_score_picker, "best score, random ties")
    r("random-picker", "picker", pickers.random_picker, "uniformly random")
    r("weighted-random-picker", "picker", pickers.weighted_random_picker, "random by score")
    return registry
