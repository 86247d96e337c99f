"""Config loading: defaults, every validation error names file, key and reason."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from epp import config
from epp.common.params import ConfigError
from epp.common.sections import declared
from epp.datalayer.settings import DataLayerConfig
from epp.disagg.settings import DisaggConfig
from epp.flowcontrol.saturation import AdmissionConfig, SaturationConfig
from epp.scheduling.latency import LatencyPriors

CONFIGS = Path(__file__).resolve().parents[3] / "configs"


def test_default_config_is_complete() -> None:
    cfg = config.load(None)
    decode, prefill = cfg.profiles
    assert (decode.name, prefill.name) == ("decode", "prefill")
    weights = {r.plugin: r.weight for r in decode.plugins}
    assert weights["queue-scorer"] == 2
    assert weights["kv-cache-utilization-scorer"] == 2
    assert weights["prefix-cache-scorer"] == 3
    assert weights["lora-affinity-scorer"] == 4  # inactive without LoRA state
    # prefill favours cache hits and short queues; KV headroom matters where tokens decode
    assert "kv-cache-utilization-scorer" not in {r.plugin for r in prefill.plugins}
    assert cfg.saturation.queue_threshold == 5 and cfg.saturation.kv_threshold == 0.8
    assert cfg.data_layer.scrape_interval_s == 0.05 and cfg.data_layer.stale_after_s == 2.0
    assert cfg.disaggregation.coordinator == "nixl"
    sched = config.instantiate(cfg, config.builtin_registry())
    names = [o.__class__.__name__ for o in sched.observers]
    assert names == ["PrefixCacheScorer", "LoraAffinityScorer"]
    assert sched.handler.__class__.__name__ == "PDProfileHandler"


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_configs_load(path: Path) -> None:
    cfg = config.load(path)
    config.instantiate(cfg, config.builtin_registry())
    shown = config.effective_yaml(cfg)  # what `epp config show --config` prints
    assert config.effective_yaml(config.load_text(shown, str(path))) == shown


def test_partial_file_keeps_defaults_for_the_rest() -> None:
    cfg = config.load_text(
        "dataLayer: {scrapeIntervalSeconds: 0.2, orca: {requestFormat: TEXT}}", "f"
    )
    assert cfg.data_layer.scrape_interval_s == 0.2
    assert cfg.data_layer.orca.request_format == "TEXT"
    assert cfg.data_layer.stale_after_s == 2.0
    assert cfg.data_layer.max_scrapes_per_s == 400
    assert len(cfg.profiles[0].plugins) == 8  # default profiles untouched
    assert cfg.disaggregation.prefill_timeout_s == 25


def test_sections_default_to_their_dataclasses() -> None:
    cfg = config.load(None)
    assert cfg.saturation == SaturationConfig() and cfg.admission == AdmissionConfig()
    assert cfg.data_layer == DataLayerConfig() and cfg.latency == LatencyPriors()
    assert cfg.disaggregation == DisaggConfig() and cfg.endpoints == ()
    assert config.load_text("dataLayer: {orca: {}}", "f").data_layer == DataLayerConfig()


def test_the_generated_default_yaml_loads_back_as_the_default() -> None:
    """`epp config show` prints the generated YAML; it is the built-in default exactly."""
    text = config.default_yaml()
    again = config.load_text(text, "d")
    assert config.effective_yaml(again) == text
    assert replace(again, source="<default>", plugins=()) == replace(config.load(None), plugins=())
    # every setting is documented: a comment line above each key of a section
    lines = text.splitlines()
    for key in ("queueDepthThreshold", "scrapeIntervalSeconds", "requestFormat", "maxNumSeqs"):
        (at,) = [i for i, line in enumerate(lines) if line.strip().startswith(f"{key}:")]
        assert lines[at - 1].strip().startswith("# ") and len(lines[at - 1].strip()) > 10
    for _f, setting, _hint in declared(config.EppConfig):
        assert setting.doc and f"{setting.key}:" in lines


def test_plugin_parameters_show_with_their_defaults_filled_in() -> None:
    cfg = config.load_text("plugins: [{type: queue-scorer, name: q}]", "f")
    doc = yaml.safe_load(config.effective_yaml(cfg))
    assert doc["plugins"] == [
        {
            "type": "queue-scorer",
            "name": "q",
            "parameters": {"normalize": "relative", "threshold": 5},
        }
    ]
    assert doc["schedulingProfiles"] == [
        {"name": "default", "plugins": [{"pluginRef": "q", "weight": 1}]}
    ]


def test_the_saturation_filter_defaults_to_the_section_defaults() -> None:
    sched = config.build_scheduler("plugins: [{type: saturation-filter, name: s}]")
    assert sched.plugins["s"].cfg == SaturationConfig()  # type: ignore[attr-defined]


def test_plugins_without_profiles_form_one_default_profile() -> None:
    cfg = config.load_text("plugins: [{type: random-picker, name: r}]", "f")
    assert [(p.name, [r.plugin for r in p.plugins]) for p in cfg.profiles] == [("default", ["r"])]


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("plugins: [", "f:1:11: invalid YAML"),
        ("- 1", "top level must be a mapping"),
        ("plugin: []", "unknown key(s) ['plugin']"),
        ("plugins: [{type: nope}]", "plugins[0].type: unknown plugin type 'nope'"),
        ("plugins: [{name: x}]", "plugins[0].type: required"),
        ("plugins: [{type: queue-scorer, weight: 2}]", "unknown key(s) ['weight']"),
        (
            "plugins: [{type: queue-scorer}, {type: queue-scorer}]",
            "duplicate plugin name 'queue-scorer'",
        ),
        (
            "plugins: [{type: queue-scorer}]\nschedulingProfiles: "
            "[{name: p, plugins: [{pluginRef: kv}]}]",
            "schedulingProfiles[0].plugins[0].pluginRef: 'kv' is not a declared plugin",
        ),
        (
            "plugins: [{type: queue-scorer}]\nschedulingProfiles: "
            "[{name: p, plugins: [{pluginRef: queue-scorer, weight: -1}]}]",
            "weight: must be a finite number >= 0",
        ),
        (
            "plugins: [{type: queue-scorer}]\nschedulingProfiles: "
            "[{name: p, plugins: [{pluginRef: queue-scorer, weight: .nan}]}]",
            "weight: must be a finite number >= 0, got nan",
        ),
        (
            "plugins: [{type: queue-scorer}]\nschedulingProfiles: "
            "[{name: p, plugins: [{pluginRef: queue-scorer, weight: .inf}]}]",
            "weight: must be a finite number >= 0, got inf",
        ),
        (
            "plugins: [{type: prefix-cache-scorer, parameters: {loadBound: .nan}}]",
            "loadBound: must be a finite number, got nan",
        ),
        (
            "plugins: [{type: random-picker}, {type: max-score-picker}]",
            "at most one picker per profile",
        ),
        ("saturationDetector: {queueDepthThreshold: x}", "queueDepthThreshold: expected a number"),
        ("admission: {objectives: {batch: low}}", "admission.objectives"),
        ("dataLayer: {engine: tgi}", "dataLayer.engine: must be one of"),
        ("dataLayer: {orca: {oobPort: 70000}}", "orca.oobPort: an integer from 1 to 65535"),
        ("dataLayer: {scrapeMetrics: yes please}", "scrapeMetrics: expected true or false"),
        ("dataLayer: {colour: red}", "unknown parameter(s) ['colour']"),
        ("dataLayer: {maxScrapesPerSecond: -1}", "maxScrapesPerSecond: must be >= 0"),
        ("endpoints: [{address: 'nowhere'}]", "endpoints[0].address:"),
        ("endpoints: [{address: '1.2.3.4:80', role: chef}]", "endpoints[0].role: unknown role"),
        ("endpoints: [{address: '1.2.3.4:80', colour: red}]", "unknown parameter(s) ['colour']"),
        ("disaggregation: {coordinator: pigeon}", "disaggregation.coordinator: must be one of"),
        (
            "disaggregation: {bootstrapPort: 0}",
            "bootstrapPort: an integer from 1 to 65535, or null",
        ),
        ("disaggregation: {prefillTimeoutSeconds: 0}", "prefillTimeoutSeconds: must be >="),
        (
            "plugins: [{type: pd-profile-handler, parameters: {decider: coin}}, "
            "{type: random-picker}]",
            "decider: unknown decider 'coin'",
        ),
        (
            "plugins: [{type: pd-profile-handler}, {type: random-picker}]",
            "decodeProfile: no scheduling profile named 'decode'",
        ),
        (
            "plugins: [{type: pd-profile-handler, parameters: {prefixPlugin: r}}, "
            "{type: random-picker, name: r}]\nschedulingProfiles: [{name: decode, plugins: "
            "[{pluginRef: r}]}, {name: prefill, plugins: [{pluginRef: r}]}]",
            "prefixPlugin: 'r' is not a configured prefix-cache-scorer",
        ),
        (
            "plugins: [{type: pd-profile-handler, parameters: {decider: always, "
            "nonCachedTokens: 5}}, {type: random-picker}]",
            "unknown parameter(s) ['nonCachedTokens']",
        ),
    ],
)
def test_errors_name_file_key_and_reason(text: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        cfg = config.load_text(text, "f")
        config.instantiate(cfg, config.builtin_registry())
    assert fragment in str(info.value)
    assert str(info.value).startswith("f")


def test_bad_plugin_parameters_are_reported_at_instantiation() -> None:
    cfg = config.load_text(
        "plugins: [{type: prefix-cache-scorer, parameters: {blockSize: 0}}]", "f"
    )
    with pytest.raises(ConfigError, match="blockSize: must be >= 1"):
        config.instantiate(cfg, config.builtin_registry())
    cfg = config.load_text("plugins: [{type: role-filter, parameters: {roles: [chef]}}]", "f")
    with pytest.raises(ConfigError, match="unknown role 'chef'"):
        config.instantiate(cfg, config.builtin_registry())


def test_profile_handler_is_declared_once_and_never_in_a_profile() -> None:
    sched = config.build_scheduler(
        "plugins: [{type: single-profile-handler}, {type: random-picker}]"
    )
    assert type(sched.handler).__name__ == "SingleProfileHandler"
    assert [p.name for p in sched.profiles] == ["default"]
    with pytest.raises(ConfigError, match="is a profile handler; declare it under plugins only"):
        config.load_text(
            "plugins: [{type: single-profile-handler}]\n"
            "schedulingProfiles: [{name: p, plugins: [{pluginRef: single-profile-handler}]}]",
            "f",
        )


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        config.load(tmp_path / "nope.yaml")


def test_effective_yaml_round_trips() -> None:
    cfg = config.load_text(
        "admission: {objectives: {batch: -1}}\n"
        "latencyModel: {maxNumSeqs: 8}\n"
        "endpoints: [{address: '10.0.0.1:8000', role: prefill, labels: {zone: a}}]\n",
        "f",
    )
    text = config.effective_yaml(cfg)
    again = config.load_text(text, "f")
    assert replace(again, plugins=()) == replace(cfg, plugins=())
    assert config.effective_yaml(again) == text  # plugins: their parameters filled in


def test_static_endpoints_carry_role_engine_and_labels() -> None:
    cfg = config.load_text(
        "dataLayer: {engine: sglang}\n"
        "endpoints:\n"
        "- {address: '10.0.0.1:8000', role: prefill}\n"
        "- {address: '10.0.0.2:8000', role: both, engine: vllm, labels: {zone: a}}\n"
        "- {address: '[fd00::1]:8000'}\n",
        "f",
    )
    a, b, c = cfg.endpoints
    assert (a.address, a.role.value, a.engine) == ("10.0.0.1:8000", "prefill", "sglang")
    assert (b.role.value, b.engine, dict(b.labels)) == ("prefill-decode", "vllm", {"zone": "a"})
    assert (c.address, c.role.value) == ("[fd00::1]:8000", "decode")


def test_the_embedded_latency_priors_match_the_dataclass_defaults() -> None:
    """LatencyPriors holds each default once; the YAML default must not drift from it."""
    assert config.load_text(config.default_yaml(), "d").latency == LatencyPriors()
    assert config.load_text("latencyModel: {}", "f").latency == LatencyPriors()
    assert config.load_text("latencyModel: {maxNumSeqs: 8}", "f").latency.max_num_seqs == 8
    with pytest.raises(config.ConfigError, match=r"latencyModel\.maxNumSeqs"):
        config.load_text("latencyModel: {maxNumSeqs: 0}", "f")
    with pytest.raises(config.ConfigError, match=r"latencyModel\.window"):
        config.load_text("latencyModel: {window: 2}", "f")
    with pytest.raises(config.ConfigError, match="unknown"):
        config.load_text("latencyModel: {overhead: 3}", "f")
