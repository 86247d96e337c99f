"""The EPP's configuration file: YAML modelled on the Inference Extension's
``EndpointPickerConfig``, plus our own sections.

Loaded in phases: parse (YAML) -> defaults -> validate (typed, every error names the
file and key) -> instantiate (plugins built through the registry). Each section is a
dataclass beside the component that uses it, holding its defaults and their docs
(:mod:`epp.common.sections`); the default plugins and profiles are declared in
:mod:`epp.scheduling.defaults`. The built-in default as YAML is generated from both
(:func:`default_yaml`: what ``epp config show`` prints; docs/configuration.md holds a
copy a test keeps equal).
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from epp.common.addresses import parse_address
from epp.common.lazymodule import lazy_module
from epp.common.params import ConfigError, Params
from epp.common.sections import (
    declared,
    read_section,
    render_section,
    section_key,
    yaml_value,
)
from epp.datalayer.engines import ENGINES
from epp.datalayer.settings import DataLayerConfig
from epp.disagg.settings import DisaggConfig
from epp.extproc.conformance import ConformanceConfig
from epp.flowcontrol.queues import FlowControlConfig
from epp.flowcontrol.saturation import AdmissionConfig, SaturationConfig
from epp.llmd import routerconfig
from epp.lora.placement import PlacementConfig
from epp.modelnames import ModelsConfig
from epp.scheduling import defaults
from epp.scheduling.base import ReferencesPlugins, RoutingObserver
from epp.scheduling.latency import LatencyModel, LatencyPriors
from epp.scheduling.profile import Profile, WeightedScorer
from epp.scheduling.registry import INSTALLED_PLUGINS, Registry, register_builtin_plugins
from epp.scheduling.scheduler import ProfileScheduler, SingleProfileHandler
from epp.types import Endpoint, Role

if TYPE_CHECKING:
    import yaml
else:  # only for a config file: the built-in default has no text to parse
    yaml = lazy_module("yaml")

API_VERSION = "epp.dev/v1alpha1"
KIND = "EndpointPickerConfig"


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
class EppConfig:
    """A validated config. Each section field's default and YAML key are declared with
    :func:`~epp.common.sections.section_key`; the YAML lists them in this order."""

    source: str
    plugins: tuple[PluginSpec, ...]
    profiles: tuple[ProfileSpec, ...]
    saturation: SaturationConfig = field(
        default_factory=SaturationConfig, metadata=section_key("saturationDetector")
    )
    admission: AdmissionConfig = field(
        default_factory=AdmissionConfig, metadata=section_key("admission")
    )
    flow_control: FlowControlConfig = field(
        default_factory=FlowControlConfig, metadata=section_key("flowControl")
    )
    data_layer: DataLayerConfig = field(
        default_factory=DataLayerConfig, metadata=section_key("dataLayer")
    )
    latency: LatencyPriors = field(
        default_factory=LatencyPriors, metadata=section_key("latencyModel")
    )
    disaggregation: DisaggConfig = field(
        default_factory=DisaggConfig, metadata=section_key("disaggregation")
    )
    models: ModelsConfig = field(default_factory=ModelsConfig, metadata=section_key("models"))
    lora_placement: PlacementConfig = field(
        default_factory=PlacementConfig, metadata=section_key("loraPlacement")
    )
    conformance: ConformanceConfig = field(
        default_factory=ConformanceConfig, metadata=section_key("conformance")
    )
    # static endpoints (beside `epp serve --decode/--prefill` flags and discovery)
    endpoints: tuple[Endpoint, ...] = ()


def top_level_keys() -> set[str]:
    sections = {s.key for _f, s, _hint in declared(EppConfig)}
    return sections | {"apiVersion", "kind", "plugins", "schedulingProfiles", "endpoints"}


# -- phase 1: parse ---------------------------------------------------------------------
def parse(text: str, source: str) -> dict[str, Any]:
    if not text.strip():  # no file: the defaults, with no YAML parser imported
        return {}
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
    """Fill in the default plugins and profiles where the file declares none (sections
    take their dataclasses' defaults key by key when validated). A file that declares
    ``plugins`` owns the plugin list (and its profiles) entirely."""
    known = top_level_keys()
    unknown = sorted(set(doc) - known)
    if unknown:
        raise ConfigError(f"{source}: unknown key(s) {unknown}; known: {sorted(known)}")
    merged = {
        "plugins": copy.deepcopy(list(defaults.PLUGINS)),
        "schedulingProfiles": copy.deepcopy(list(defaults.PROFILES)),
        **doc,
    }
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
    sections = {
        f.name: read_section(hint, doc.get(s.key), f"{source}: {s.key}")
        for f, s, hint in declared(EppConfig)
    }
    return EppConfig(
        source=source,
        plugins=plugins,
        profiles=tuple(profiles),
        endpoints=_endpoints(doc.get("endpoints"), source, sections["data_layer"].engine),
        **sections,
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
    cfg: EppConfig,
    registry: Registry,
    clock: Callable[[], float] = time.monotonic,
    *,
    reuse: Mapping[str, Any] | None = None,
    latency: LatencyModel | None = None,
    objectives: Mapping[str, int] | None = None,
) -> ProfileScheduler:
    """Build the scheduler. ``reuse``: plugin name -> an instance an earlier call built
    from the same spec, kept with what it learned (a config reload); ``latency``: the
    model to keep (its priors are the caller's business), else a new one from the
    config's priors; ``objectives``: the watched InferenceObjectives' priorities (a live
    mapping discovery keeps), else none."""
    instances: dict[str, Any] = {}
    for spec in cfg.plugins:
        if reuse is not None and spec.name in reuse:
            instances[spec.name] = reuse[spec.name]
            continue
        params = _plugin_params(cfg, spec)
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
        latency=LatencyModel(cfg.latency) if latency is None else latency,
        objectives={} if objectives is None else objectives,
    )


def _plugin_params(cfg: EppConfig, spec: PluginSpec) -> Params:
    return Params(f"{cfg.source}: plugin {spec.name!r} parameters", spec.parameters)


def load(path: Path | None, registry: Registry | None = None) -> EppConfig:
    """Parse, default and validate a config file (or the built-in default)."""
    if path is None:
        return load_text("", "<default>", registry)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config file: {exc.strerror}") from None
    return load_text(text, str(path), registry)


def load_text(text: str, source: str, registry: Registry | None = None) -> EppConfig:
    registry = registry or builtin_registry()
    doc = routerconfig.translate(parse(text, source), source)
    return validate(with_defaults(doc, source, registry), source, registry)


def builtin_registry() -> Registry:
    """The built-in plugin types, and those installed packages add (epp.plugins)."""
    return register_builtin_plugins(Registry(INSTALLED_PLUGINS))


def build_scheduler(
    text: str, clock: Callable[[], float] = time.monotonic, source: str = "<config>"
) -> ProfileScheduler:
    """Config text -> scheduler in one call (tests, benchmarks)."""
    registry = builtin_registry()
    return instantiate(load_text(text, source, registry), registry, clock)


# -- the effective config, as YAML ------------------------------------------------------------
def default_yaml() -> str:
    """The built-in default config: what the EPP runs without ``--config``, generated
    from the section dataclasses and the default plugins (``epp config show``)."""
    return effective_yaml(load(None))


def effective_yaml(cfg: EppConfig, registry: Registry | None = None) -> str:
    """The configuration as it runs, as commented YAML: every section setting and
    every plugin parameter, defaults filled in. It loads back as the same config."""
    registry = registry or builtin_registry()
    lines = [
        f"apiVersion: {API_VERSION}",
        f"kind: {KIND}",
        "# plugin instances, each with its parameters (`epp config plugins` lists the types)",
        "plugins:",
    ]
    kinds = {}
    for spec in cfg.plugins:
        plugin = registry.get(spec.type, spec.name)
        kinds[spec.name] = plugin.kind
        lines += [f"# {plugin.kind}: {plugin.summary}", f"- type: {yaml_value(spec.type)}"]
        if spec.name != spec.type:
            lines.append(f"  name: {yaml_value(spec.name)}")
        params = _plugin_params(cfg, spec)
        plugin.factory(params)  # reading fills in each default
        if params.resolved:
            lines.append("  parameters:")
            lines += [f"    {k}: {yaml_value(v)}" for k, v in params.resolved.items()]
    lines += [
        "# each profile: its filters, weighted scorers and picker (default: max-score-picker)",
        "schedulingProfiles:",
    ]
    for prof in cfg.profiles:
        lines.append(f"- name: {yaml_value(prof.name)}")
        lines.append("  plugins:" if prof.plugins else "  plugins: []")
        for ref in prof.plugins:
            lines.append(f"  - pluginRef: {yaml_value(ref.plugin)}")
            if kinds[ref.plugin] == "scorer":
                lines.append(f"    weight: {yaml_value(ref.weight)}")
    for f, s, _hint in declared(EppConfig):
        lines += [f"# {s.doc}", f"{s.key}:", *render_section(getattr(cfg, f.name), 2)]
    lines += [
        "# static endpoints: address (host:port), role (decode, prefill, prefill-decode),",
        "# engine (default: dataLayer.engine), labels",
        "endpoints:" if cfg.endpoints else "endpoints: []",
    ]
    for e in cfg.endpoints:
        doc = {"address": e.address, "role": e.role.value, "engine": e.engine}
        lines.append(f"- {yaml_value({**doc, 'labels': dict(e.labels)})}")
    return "\n".join(lines) + "\n"
