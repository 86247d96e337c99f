"""Registries open to installed packages (epp.common.extensions): entry points listed once,
each loaded on first use; built-in names win; a broken or disputed entry point is an
error naming it and its package, when its name is used. The packages here are bare
``*.dist-info`` directories whose entry points name objects in this module."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import pytest

from epp import config
from epp.common.extensions import ExtensionError
from epp.common.params import ConfigError, Params
from epp.datalayer.engines import ENGINES, EngineMetricNames
from epp.disagg.coordinators import COORDINATORS, NixlCoordinator
from epp.scheduling.base import CycleContext
from epp.scheduling.registry import INSTALLED_PLUGINS, PluginType, Registry
from epp.scheduling.registry import register_builtin_plugins as builtins
from epp.serving.sources import DISCOVERY_SOURCES, DiscoveryKind
from epp.types import EndpointState

HERE = __name__
TINY = EngineMetricNames(engine="tiny", waiting="tiny_waiting", running="tiny_running",
                         kv_usage=("tiny_kv",))  # fmt: skip
NOT_A_DIALECT = "just a string"


class Constant:
    def __init__(self, value: float) -> None:
        self.value = value

    def score(self, ctx: CycleContext, candidates: Sequence[EndpointState]) -> list[float]:
        return [self.value] * len(candidates)


def constant_scorer(p: Params) -> Constant:
    return Constant(p.number("value", 0.5, minimum=0.0))


CONSTANT = PluginType("scorer", constant_scorer, "the same score for everyone")
SOURCE = DiscoveryKind("nothing", lambda ctx: None)


def install(root: Path, package: str, entry_points: str) -> None:
    """A package as pip leaves it in site-packages, minus the code (it is this module)."""
    dist = root / f"{package.replace('-', '_')}-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(entry_points)


def test_an_installed_engine_dialect_joins_the_built_ins(tmp_path: Path) -> None:
    install(tmp_path, "tiny-ext", f"[epp.engines]\ntiny = {HERE}:TINY\n")
    engines = ENGINES.on_path([str(tmp_path)])
    assert list(engines) == ["vllm", "sglang", "trtllm", "tiny"]
    assert "tiny" in engines and engines["tiny"] is TINY
    assert engines["vllm"] is ENGINES["vllm"]


def test_a_built_in_name_is_reserved_and_the_clash_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    install(tmp_path, "shadow", f"""\
[epp.coordinators]
nixl = {HERE}:constant_scorer
mine = {HERE}:Constant
""")  # fmt: skip
    coordinators = COORDINATORS.on_path([str(tmp_path)])
    with caplog.at_level(logging.ERROR, logger="epp.common.extensions"):
        assert coordinators["nixl"] is NixlCoordinator
        assert sorted(coordinators) == ["concurrent", "kv-pool", "mine", "nixl", "sidecar"]
        assert coordinators["mine"] is Constant
    clashes = [r.getMessage() for r in caplog.records]
    assert clashes == [
        f"entry point epp.coordinators 'nixl' ({HERE}:constant_scorer from shadow 1.0) is "
        "ignored: 'nixl' is a built-in coordinator, and built-in names are reserved; "
        "rename the entry point"
    ]


def test_what_cannot_be_used_fails_when_named_and_says_why(tmp_path: Path) -> None:
    install(tmp_path, "broken-ext", f"""\
[epp.engines]
gone = {HERE}_missing:TINY
text = {HERE}:NOT_A_DIALECT
misnamed = {HERE}:TINY
""")  # fmt: skip
    engines = ENGINES.on_path([str(tmp_path)])
    assert {"gone", "text", "misnamed"} <= set(engines)  # listing imports nothing
    with pytest.raises(ExtensionError) as gone:
        engines["gone"]
    assert str(gone.value).startswith(
        f"entry point epp.engines 'gone' ({HERE}_missing:TINY from broken-ext 1.0): cannot "
        f"load: ModuleNotFoundError: No module named '{HERE}_missing'"
    )
    with pytest.raises(ExtensionError, match=r"'text' .*: expected an instance of epp.datalayer"):
        engines["text"]
    with pytest.raises(ExtensionError, match=r"its engine is 'tiny', not .* name 'misnamed'"):
        engines["misnamed"]
    assert engines["vllm"] is ENGINES["vllm"]  # the rest still works


def test_a_name_two_packages_claim_is_refused(tmp_path: Path) -> None:
    install(tmp_path, "one", f"[epp.discovery]\nsame = {HERE}:SOURCE\n")
    install(tmp_path, "two", f"[epp.discovery]\nsame = {HERE}:SOURCE\n")
    sources = DISCOVERY_SOURCES.on_path([str(tmp_path)])
    with pytest.raises(ExtensionError, match=r"'same': installed packages disagree .*one 1.0"):
        sources["same"]


def test_an_installed_plugin_type_is_used_from_a_config(tmp_path: Path) -> None:
    install(tmp_path, "const-scorer", f"""\
[epp.plugins]
constant-scorer = {HERE}:CONSTANT
queue-scorer = {HERE}:CONSTANT
broken-scorer = {HERE}:NOT_A_DIALECT
""")  # fmt: skip
    registry = builtins(Registry(INSTALLED_PLUGINS.on_path([str(tmp_path)])))
    text = "plugins:\n- type: constant-scorer\n  parameters: {value: 0.25}\n"
    cfg = config.load_text(text, "c.yaml", registry)
    scheduler = config.instantiate(cfg, registry)
    scorer = scheduler.plugins["constant-scorer"]
    assert isinstance(scorer, Constant) and scorer.value == 0.25
    assert registry.types()["queue-scorer"].summary != CONSTANT.summary  # built-in wins
    with pytest.raises(ConfigError, match=r"entry point epp.plugins 'broken-scorer' .*: expected"):
        config.load_text("plugins:\n- type: broken-scorer\n", "b.yaml", registry)
    assert "broken-scorer" in registry.types()  # listed without loading it
    with pytest.raises(ConfigError, match=r"b.yaml: plugins\[0\].type: entry point"):
        registry.get("broken-scorer", "b.yaml: plugins[0].type")
    with pytest.raises(ConfigError, match=r"unknown plugin type 'nope'; known types: .*'constant"):
        config.load_text("plugins:\n- type: nope\n", "n.yaml", registry)


def test_the_shipped_registries_hold_the_built_ins() -> None:
    assert {"nixl", "sidecar", "concurrent", "kv-pool"} <= set(COORDINATORS)
    assert list(DISCOVERY_SOURCES)[:5] == [
        "static",
        "endpoints-file",
        "kubernetes",
        "kubernetes-selector",
        "admin-api",
    ]
    assert COORDINATORS["nixl"] is NixlCoordinator


def test_plugin_packages_import_the_discovery_source_api_from_its_older_path_too() -> None:
    """docs/extending.md says epp.sources, the discovery source API's older path, still
    works: it re-exports epp.serving.sources, as epp.plugin does."""
    import epp.serving.sources
    import epp.sources

    assert epp.sources.DiscoveryKind is epp.serving.sources.DiscoveryKind
    assert epp.sources.DiscoverySource is epp.serving.sources.DiscoverySource
    assert epp.sources.DiscoveryContext is epp.serving.sources.DiscoveryContext
