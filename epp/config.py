"""The EPP's configuration file: YAML modelled on the Inference Extension's
``EndpointPickerConfig``, plus our own sections.

Loaded in phases: parse (YAML) -> defaults -> validate (typed, every error names the
file and key) -> instantiate (plugins built through the registry). A complete default
lives in :data:`DEFAULT_CONFIG`, used when no file is given.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from epp.addresses import parse_address
from epp.datalayer.engines import ENGINES
from epp.disagg.coordinators import COORDINATORS
from epp.scheduling.base import ReferencesPlugins, RoutingObserver
from epp.scheduling.latency import LatencyModel, LatencyPriors
from epp.scheduling.params import ConfigError, Params
from epp.scheduling.profile import Profile, WeightedScorer
from epp.scheduling.registry import INSTALLED_PLUGINS, Registry, register_builtin_plugins
from epp.scheduling.saturation import AdmissionConfig, SaturationConfig
from epp.scheduling.scheduler import ProfileScheduler, SingleProfileHandler
from epp.types import Endpoint, Role

DEFAULT_CONFIG = """\
apiVersion: epp.dev/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: pd-profile-handler
  parameters:
    decodeProfile: decode
    prefillProfile: prefill
    decider: prefix-based
    nonCachedTokens: 256
    prefixPlugin: prefix-cache-scorer
- type: decode-filter
- type: prefill-filter
- type: queue-scorer
  parameters:
    normalize: threshold
    threshold: 5
- type: kv-cache-utilization-scorer
- type: in-flight-load-scorer
- type: prefix-cache-scorer
  parameters:
    blockSize: 16
    maxPrefixBlocksToMatch: 256
    lruCapacityPerServer: 31250
    loadBound: 1.25
- type: max-score-picker
  parameters:
    maxTargets: 3
schedulingProfiles:
- name: decode
  plugins:
  - pluginRef: decode-filter
  - pluginRef: queue-scorer
    weight: 2
  - pluginRef: kv-cache-utilization-scorer
    weight: 2
  - pluginRef: in-flight-load-scorer
    weight: 1
  - pluginRef: prefix-cache-scorer
    weight: 3
  - pluginRef: max-score-picker
- name: prefill
  plugins:
  - pluginRef: prefill-filter
  - pluginRef: queue-scorer
    weight: 2
  - pluginRef: in-flight-load-scorer
    weight: 1
  - pluginRef: prefix-cache-scorer
    weight: 3
  - pluginRef: max-score-picker
saturationDetector:
  queueDepthThreshold: 5
  kvCacheUtilThreshold: 0.8
admission:
  defaultPriority: 0
  objectives: {}
dataLayer:
  scrapeMetrics: true
  scrapeIntervalSeconds: 0.05
  maxScrapesPerSecond: 400
  scrapeTimeoutSeconds: 5.0
  staleAfterSeconds: 2.0
  engine: vllm
  orca:
    requestFormat: none
    oobPort: null
    reportIntervalSeconds: 1.0
latencyModel:
  overheadMs: 10.0
  prefillMsPerToken: 0.1
  decodeMsPerToken: 20.0
  decodeMsPerRunning: 0.5
  outputTokens: 128
  priorSamples: 4
  window: 128
  maxNumSeqs: null
disaggregation:
  coordinator: nixl
  prefillTimeoutSeconds: 25
  connectTimeoutSeconds: 1.0
  bootstrapPort: null
endpoints: []
"""

_TOP_KEYS = {
    "apiVersion",
    "kind",
    "plugins",
    "schedulingProfiles",
    "saturationDetector",
    "admission",
    "dataLayer",
    "latencyModel",
    "disaggregation",
    "endpoints",
}


@dataclass(frozen=True)
class PluginSpec:
    type: str
    name: str
    parameters: Mapping[str, Any]


@dataclass(frozen=True)
class ProfileRef:
    plugin: str
    weight: float


@dataclass(frozen=True)
class ProfileSpec:
    name: str
    plugins: tuple[ProfileRef, ...]


@dataclass(frozen=True)
class DataLayerConfig:
    scrape_metrics: bool = True
    scrape_interval_s: float = 0.05
    # all endpoints together; a larger pool is scraped less often (0 = no limit)
    max_scrapes_per_s: float = 400.0
    scrape_timeout_s: float = 5.0  # a busy engine renders /metrics slowly
    stale_after_s: float = 2.0
    engine: str = "vllm"
    orca_request_format: str | None = None  # "TEXT" | "JSON": ask vLLM for ORCA headers
    orca_oob_port: int | None = None  # serve port of OpenRcaService on each endpoint host
    orca_report_interval_s: float = 1.0


@dataclass(frozen=True)
class DisaggConfig:
    """How prefill and decode legs meet (``disaggregation`` section; see epp.disagg)."""

    coordinator: str = "nixl"
    # the whole prefill leg; keep it below Envoy's ext_proc message_timeout (30 s in the
    # shipped configs), or Envoy fails the request before the EPP can decode alone
    prefill_timeout_s: float = 25.0
    connect_timeout_s: float = 1.0  # reaching the prefill server; then decode-only
    bootstrap_port: int | None = None  # SGLang bootstrap port; None: the prefill's own port


@dataclass(frozen=True)
class EppConfig:
    source: str
    plugins: tuple[PluginSpec, ...]
    profiles: tuple[ProfileSpec, ...]
    saturation: SaturationConfig
    admission: AdmissionConfig
    data_layer: DataLayerConfig
    disaggregation: DisaggConfig = field(default_factory=DisaggConfig)
    latency: LatencyPriors = field(default_factory=LatencyPriors)
    # static endpoints (beside `epp serve --decode/--prefill` flags and discovery)
    endpoints: tuple[Endpoint, ...] = ()
    raw: Mapping[str, Any] = field(repr=False, default_factory=dict)


# -- phase 1: parse ---------------------------------------------------------------------
def parse(text: str, source: str) -> dict[str, Any]:
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{where}: invalid YAML: {problem}") from None
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise ConfigError(f"{source}: the top level must be a mapping, got {type(doc).__name__}")
    return doc


# -- phase 2: defaults --------------------------------------------------------------------
def with_defaults(doc: Mapping[str, Any], source: str, registry: Registry) -> dict[str, Any]:
    """Fill what the file leaves out from DEFAULT_CONFIG, section by section. A file
    that declares ``plugins`` owns the plugin list (and its profiles) entirely."""
    default = parse(DEFAULT_CONFIG, "<default>")
    unknown = sorted(set(doc) - _TOP_KEYS)
    if unknown:
        raise ConfigError(f"{source}: unknown key(s) {unknown}; known: {sorted(_TOP_KEYS)}")
    merged = dict(default)
    sections = ("dataLayer", "disaggregation", "latencyModel")
    merged.update({k: v for k, v in doc.items() if k not in sections})
    if "plugins" in doc and "schedulingProfiles" not in doc:
        # like the Inference Extension: one profile "default" using every plugin but
        # the profile handler
        plugins = doc["plugins"] if isinstance(doc["plugins"], list) else []
        types = registry.types()
        refs = [
            {"pluginRef": p.get("name", p.get("type"))}
            for p in plugins
            if isinstance(p, dict)
            and getattr(types.get(str(p.get("type"))), "kind", None) != "handler"
        ]
        merged["schedulingProfiles"] = [{"name": "default", "plugins": refs}]
    data_layer = dict(default["dataLayer"])
    data_layer.update(_mapping(doc.get("dataLayer"), f"{source}: dataLayer"))
    orca = dict(default["dataLayer"]["orca"])
    orca.update(_mapping(data_layer.get("orca"), f"{source}: dataLayer.orca"))
    data_layer["orca"] = orca
    merged["dataLayer"] = data_layer
    disagg = dict(default["disaggregation"])
    disagg.update(_mapping(doc.get("disaggregation"), f"{source}: disaggregation"))
    merged["disaggregation"] = disagg
    latency = dict(default["latencyModel"])
    latency.update(_mapping(doc.get("latencyModel"), f"{source}: latencyModel"))
    merged["latencyModel"] = latency
    return merged


# -- phase 3: validate ----------------------------------------------------------------------
def validate(doc: Mapping[str, Any], source: str, registry: Registry) -> EppConfig:
    plugins = _plugins(doc.get("plugins"), source, registry)
    names = {p.name for p in plugins}
    profiles_raw = doc.get("schedulingProfiles")
    if not isinstance(profiles_raw, list) or not profiles_raw:
        raise ConfigError(f"{source}: schedulingProfiles must be a non-empty list")
    profiles = []
    seen_profiles: set[str] = set()
    for i, raw in enumerate(profiles_raw):
        where = f"{source}: schedulingProfiles[{i}]"
        raw = _mapping(raw, where)
        name = raw.get("name")
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{where}.name: required, a non-empty string")
        if name in seen_profiles:
            raise ConfigError(f"{where}.name: duplicate profile name {name!r}")
        seen_profiles.add(name)
        refs = []
        pickers = 0
        for j, ref in enumerate(_list(raw.get("plugins"), f"{where}.plugins")):
            rwhere = f"{where}.plugins[{j}]"
            ref = _mapping(ref, rwhere)
            plugin = ref.get("pluginRef")
            if plugin not in names:
                raise ConfigError(
                    f"{rwhere}.pluginRef: {plugin!r} is not a declared plugin; "
                    f"declared: {sorted(names)}"
                )
            weight = ref.get("weight", 1)
            if (
                isinstance(weight, bool)
                or not isinstance(weight, int | float)
                or not math.isfinite(weight)
                or weight < 0
            ):
                raise ConfigError(f"{rwhere}.weight: must be a finite number >= 0, got {weight!r}")
            kind = registry.get(_spec(plugins, plugin).type, rwhere).kind
            if kind == "handler":
                raise ConfigError(
                    f"{rwhere}.pluginRef: {plugin!r} is a profile handler; declare it under "
                    "plugins only, not inside a profile"
                )
            pickers += kind == "picker"
            refs.append(ProfileRef(plugin, float(weight)))
        if pickers > 1:
            raise ConfigError(f"{where}: at most one picker per profile, found {pickers}")
        profiles.append(ProfileSpec(name, tuple(refs)))
    sat = Params(f"{source}: saturationDetector", doc.get("saturationDetector"))
    saturation = SaturationConfig(
        queue_threshold=sat.number("queueDepthThreshold", 5, minimum=1e-9),
        kv_threshold=sat.number("kvCacheUtilThreshold", 0.8, minimum=1e-9),
    )
    sat.done()
    adm = Params(f"{source}: admission", doc.get("admission"))
    objectives_raw = adm._get("objectives") or {}
    if not isinstance(objectives_raw, Mapping) or not all(
        isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool)
        for k, v in objectives_raw.items()
    ):
        raise ConfigError(
            f"{source}: admission.objectives: expected objective name -> integer priority, "
            f"got {objectives_raw!r}"
        )
    admission = AdmissionConfig(
        objectives=dict(objectives_raw), default_priority=adm.integer("defaultPriority", 0)
    )
    adm.done()
    data_layer = _data_layer(doc.get("dataLayer"), source)
    return EppConfig(
        source=source,
        plugins=plugins,
        profiles=tuple(profiles),
        saturation=saturation,
        admission=admission,
        data_layer=data_layer,
        disaggregation=_disaggregation(doc.get("disaggregation"), source),
        latency=_latency(doc.get("latencyModel"), source),
        endpoints=_endpoints(doc.get("endpoints"), source, data_layer.engine),
        raw=doc,
    )


def _plugins(raw: Any, source: str, registry: Registry) -> tuple[PluginSpec, ...]:
    specs = []
    seen: set[str] = set()
    for i, item in enumerate(_list(raw, f"{source}: plugins")):
        where = f"{source}: plugins[{i}]"
        item = _mapping(item, where)
        extra = sorted(set(item) - {"type", "name", "parameters"})
        if extra:
            raise ConfigError(f"{where}: unknown key(s) {extra}; use type, name, parameters")
        ptype = item.get("type")
        if not isinstance(ptype, str):
            raise ConfigError(f"{where}.type: required, the plugin's type name")
        registry.get(ptype, f"{where}.type")
        name = item.get("name", ptype)
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{where}.name: must be a non-empty string")
        if name in seen:
            raise ConfigError(f"{where}.name: duplicate plugin name {name!r}")
        seen.add(name)
        specs.append(PluginSpec(ptype, name, _mapping(item.get("parameters"), f"{where}")))
    return tuple(specs)


def _data_layer(raw: Any, source: str) -> DataLayerConfig:
    p = Params(f"{source}: dataLayer", raw)
    d = DataLayerConfig()  # the defaults, written once
    scrape = p.boolean("scrapeMetrics", d.scrape_metrics)
    orca = Params(f"{source}: dataLayer.orca", p._get("orca"))
    fmt = orca.string("requestFormat", "none", choices=("none", "TEXT", "JSON"))
    oob_port = orca._get("oobPort")
    if oob_port is not None and (
        isinstance(oob_port, bool) or not isinstance(oob_port, int) or not 0 < oob_port < 65536
    ):
        raise ConfigError(f"{source}: dataLayer.orca.oobPort: a port 1-65535 or null")
    cfg = DataLayerConfig(
        scrape_metrics=scrape,
        scrape_interval_s=p.number("scrapeIntervalSeconds", d.scrape_interval_s, minimum=0.001),
        max_scrapes_per_s=p.number("maxScrapesPerSecond", d.max_scrapes_per_s, minimum=0.0),
        scrape_timeout_s=p.number("scrapeTimeoutSeconds", d.scrape_timeout_s, minimum=0.001),
        stale_after_s=p.number("staleAfterSeconds", d.stale_after_s, minimum=0.001),
        engine=p.string("engine", d.engine, choices=tuple(ENGINES)),
        orca_request_format=None if fmt == "none" else fmt,
        orca_oob_port=oob_port,
        orca_report_interval_s=orca.number(
            "reportIntervalSeconds", d.orca_report_interval_s, minimum=0.01
        ),
    )
    orca.done()
    p.done()
    return cfg


def _endpoints(raw: Any, source: str, default_engine: str) -> tuple[Endpoint, ...]:
    """``endpoints: [{address: "host:port", role: prefill, engine: vllm, labels: {..}}]``
    (host: an IP or a name); ``engine`` defaults to ``dataLayer.engine``."""
    out = []
    for i, item in enumerate(_list(raw or [], f"{source}: endpoints")):
        p = Params(f"{source}: endpoints[{i}]", _mapping(item, f"{source}: endpoints[{i}]"))
        try:
            host, port = parse_address(p.string("address", ""))
        except ValueError as exc:
            raise ConfigError(f"{p.where}.address: {exc}") from None
        try:
            role = Role.parse(p.string("role", Role.DECODE.value))
        except ValueError as exc:
            raise ConfigError(f"{p.where}.role: {exc}") from None
        engine = p.string("engine", default_engine, choices=tuple(ENGINES))
        out.append(Endpoint(host, port, role, p.mapping("labels"), engine))
        p.done()
    return tuple(out)


def _disaggregation(raw: Any, source: str) -> DisaggConfig:
    p = Params(f"{source}: disaggregation", raw)
    bootstrap = p._get("bootstrapPort")
    if bootstrap is not None and (
        isinstance(bootstrap, bool) or not isinstance(bootstrap, int) or not 0 < bootstrap < 65536
    ):
        raise ConfigError(
            f"{source}: disaggregation.bootstrapPort: a port 1-65535 or null, got {bootstrap!r}"
        )
    cfg = DisaggConfig(
        coordinator=p.string("coordinator", "nixl", choices=tuple(COORDINATORS)),
        prefill_timeout_s=p.number("prefillTimeoutSeconds", 25.0, minimum=0.001),
        connect_timeout_s=p.number("connectTimeoutSeconds", 1.0, minimum=0.001),
        bootstrap_port=bootstrap,
    )
    p.done()
    return cfg


def _latency(raw: Any, source: str) -> LatencyPriors:
    p = Params(f"{source}: latencyModel", raw)
    d = LatencyPriors()  # the defaults, written once
    slots = p._get("maxNumSeqs")
    if slots is not None and (isinstance(slots, bool) or not isinstance(slots, int) or slots < 1):
        raise ConfigError(f"{source}: latencyModel.maxNumSeqs: an integer >= 1 or null")
    cfg = LatencyPriors(
        overhead_ms=p.number("overheadMs", d.overhead_ms, minimum=0.0),
        prefill_ms_per_token=p.number("prefillMsPerToken", d.prefill_ms_per_token, minimum=0.0),
        decode_ms_per_token=p.number("decodeMsPerToken", d.decode_ms_per_token, minimum=0.0),
        decode_ms_per_running=p.number("decodeMsPerRunning", d.decode_ms_per_running, minimum=0.0),
        output_tokens=p.number("outputTokens", d.output_tokens, minimum=1.0),
        prior_samples=p.number("priorSamples", d.prior_samples, minimum=0.001),
        window=p.integer("window", d.window, minimum=8),
        max_num_seqs=slots,
    )
    p.done()
    return cfg


def _spec(plugins: tuple[PluginSpec, ...], name: str) -> PluginSpec:
    return next(p for p in plugins if p.name == name)


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: expected a mapping, got {value!r}")
    return dict(value)


def _list(value: Any, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ConfigError(f"{where}: expected a list, got {value!r}")
    return value


# -- phase 4: instantiate -------------------------------------------------------------------
def instantiate(
    cfg: EppConfig, registry: Registry, clock: Callable[[], float] = time.monotonic
) -> ProfileScheduler:
    instances: dict[str, Any] = {}
    for spec in cfg.plugins:
        params = Params(f"{cfg.source}: plugin {spec.name!r} parameters", spec.parameters)
        instances[spec.name] = registry.get(spec.type, spec.name).factory(params)
        params.done()
    profiles = []
    for prof in cfg.profiles:
        filters, scorers, picker = [], [], None
        for ref in prof.plugins:
            kind = registry.get(_spec(cfg.plugins, ref.plugin).type, ref.plugin).kind
            if kind == "filter":
                filters.append((ref.plugin, instances[ref.plugin]))
            elif kind == "scorer":
                scorers.append(WeightedScorer(ref.plugin, instances[ref.plugin], ref.weight))
            else:
                picker = instances[ref.plugin]
        if picker is None:
            picker = registry.get("max-score-picker", prof.name).factory(Params(prof.name, {}))
        profiles.append(Profile(prof.name, tuple(filters), tuple(scorers), picker))
    handlers = [
        instances[spec.name]
        for spec in cfg.plugins
        if registry.get(spec.type, spec.name).kind == "handler"
    ]
    if len(handlers) > 1:
        raise ConfigError(
            f"{cfg.source}: plugins: at most one profile handler, found {len(handlers)}"
        )
    profile_names = [p.name for p in profiles]
    for instance in instances.values():
        if isinstance(instance, ReferencesPlugins):
            instance.bind(instances, profile_names)
    observers = [i for i in instances.values() if isinstance(i, RoutingObserver)]
    return ProfileScheduler(
        profiles=profiles,
        handler=handlers[0] if handlers else SingleProfileHandler(),
        saturation=cfg.saturation,
        admission=cfg.admission,
        stale_after_s=cfg.data_layer.stale_after_s,
        clock=clock,
        observers=observers,
        plugins=instances,
        latency=LatencyModel(cfg.latency),
    )


def load(path: Path | None, registry: Registry | None = None) -> EppConfig:
    """Parse, default and validate a config file (or the built-in default)."""
    if path is None:
        return load_text(DEFAULT_CONFIG, "<default>", registry)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config file: {exc.strerror}") from None
    return load_text(text, str(path), registry)


def load_text(text: str, source: str, registry: Registry | None = None) -> EppConfig:
    registry = registry or builtin_registry()
    return validate(with_defaults(parse(text, source), source, registry), source, registry)


def builtin_registry() -> Registry:
    """The built-in plugin types, and those installed packages add (epp.plugins)."""
    return register_builtin_plugins(Registry(INSTALLED_PLUGINS))


def build_scheduler(
    text: str, clock: Callable[[], float] = time.monotonic, source: str = "<config>"
) -> ProfileScheduler:
    """Config text -> scheduler in one call (tests, benchmarks)."""
    registry = builtin_registry()
    return instantiate(load_text(text, source, registry), registry, clock)


def effective_yaml(cfg: EppConfig) -> str:
    """The configuration as it will run (defaults filled in), as YAML."""
    return yaml.safe_dump(dict(cfg.raw), sort_keys=False)
