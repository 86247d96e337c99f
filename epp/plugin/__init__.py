"""The EPP's public API for plugin packages: everything a scheduling plugin, a P/D
coordinator, a discovery source or an engine metric dialect imports, in one place
(docs/extending.md). Import from here only: every other module of ``epp`` is internal
and may change without notice.

What it holds: the request and endpoint views a plugin reads (``InferenceRequest``,
``Endpoint``, ``EndpointState``, ``Snapshot``, ...); the Protocol of each scheduling
plugin kind and the ``CycleContext`` a cycle gives them; a plugin's ``Params`` and its
registration (``PluginType``, entry point group ``epp.plugins``); the P/D coordinator
API (``epp.coordinators``); the discovery source API (``epp.discovery``); engine metric
dialects (``EngineMetricNames``, ``epp.engines``); the request lifecycle's hooks
(``LifecycleObserver``, the ``Routing`` and ``Exchange`` views its hooks are given).

This module only re-exports; the objects live where the EPP uses them."""

from epp.common.addresses import parse_address
from epp.common.params import ConfigError, Params
from epp.datalayer.engines import EngineMetricNames
from epp.disagg.coordinators import Coordinator, CoordinatorEnv, DecodeLeg, Handoff
from epp.errors import NoEndpointError
from epp.lifecycle.hooks import Exchange, LifecycleObserver, Routing
from epp.scheduling.base import (
    CycleContext,
    DecodePicker,
    Filter,
    Picker,
    ProfileHandler,
    ProfileRunner,
    ReferencesPlugins,
    RoutingObserver,
    Scorer,
    ScoresPicker,
)
from epp.scheduling.registry import PluginType, Registry
from epp.serving.sources import DiscoveryContext, DiscoveryKind, DiscoverySource
from epp.types import (
    Endpoint,
    EndpointMetrics,
    EndpointState,
    InferenceRequest,
    Prediction,
    Role,
    SchedulingResult,
    Snapshot,
)

__all__ = [
    "ConfigError",
    "Coordinator",
    "CoordinatorEnv",
    "CycleContext",
    "DecodeLeg",
    "DecodePicker",
    "DiscoveryContext",
    "DiscoveryKind",
    "DiscoverySource",
    "Endpoint",
    "EndpointMetrics",
    "EndpointState",
    "EngineMetricNames",
    "Exchange",
    "Filter",
    "Handoff",
    "InferenceRequest",
    "LifecycleObserver",
    "NoEndpointError",
    "Params",
    "Picker",
    "PluginType",
    "Prediction",
    "ProfileHandler",
    "ProfileRunner",
    "ReferencesPlugins",
    "Registry",
    "Role",
    "Routing",
    "RoutingObserver",
    "SchedulingResult",
    "Scorer",
    "ScoresPicker",
    "Snapshot",
    "parse_address",
]
