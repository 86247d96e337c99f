"""The llm-d Router's data-layer and parser entries in an EndpointPickerConfig are read
into our sections; what we cannot honour is refused by name."""

from __future__ import annotations

import pytest

from epp import config
from epp.common.params import ConfigError
from tests.support.llmd_chart import DEFAULT_PLUGINS


def load(text: str) -> config.EppConfig:
    return config.load_text(text, "f.yaml")


def test_the_chart_default_plugins_load_as_our_scorers() -> None:
    cfg = load(DEFAULT_PLUGINS)
    assert [p.type for p in cfg.plugins] == [
        "queue-scorer",
        "kv-cache-utilization-scorer",
        "prefix-cache-scorer",
    ]
    assert [(r.plugin, r.weight) for r in cfg.profiles[0].plugins] == [
        ("queue-scorer", 2.0),
        ("kv-cache-utilization-scorer", 2.0),
        ("prefix-cache-scorer", 3.0),
    ]


def test_default_engine_and_openai_parser() -> None:
    cfg = load(
        "plugins:\n- type: core-metrics-extractor\n  parameters: {defaultEngine: sglang}\n"
        "- type: openai-parser\n- type: anthropic-parser\n- type: vllmhttp-parser\n"
        "- type: sglanghttp-parser\n- type: queue-scorer\n"
        "requestHandler:\n  parsers:\n  - pluginRef: openai-parser\n"
    )
    assert cfg.data_layer.engine == "sglang"
    assert [p.type for p in cfg.plugins] == ["queue-scorer"]


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("- type: metrics-data-source\n  parameters: {scheme: https}", "scheme 'https'"),
        ("- type: metrics-data-source\n  parameters: {path: /m}", "path '/m' are not supported"),
        ("- type: passthrough-parser", "request parser 'passthrough-parser' is not supported"),
        (
            "- type: core-metrics-extractor\n  parameters: {defaultEngine: x}",
            "defaultEngine: 'x' is not a known engine",
        ),
    ],
)
def test_what_we_cannot_honour_is_refused(entry: str, message: str) -> None:
    with pytest.raises(ConfigError, match=r"f\.yaml: plugins\[0\]") as info:
        load(f"plugins:\n{entry}\n- type: queue-scorer\n")
    assert message in str(info.value)
