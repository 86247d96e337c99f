"""`epp config show | plugins` as a user runs them."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from epp.serving import configcmd
from epp_harness.procs import epp_argv

DOCS = Path(__file__).resolve().parents[3] / "docs"


def epp(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(epp_argv(*args), capture_output=True, text=True, timeout=30)


def test_show_prints_the_effective_default_config() -> None:
    result = epp("config", "show")
    assert result.returncode == 0
    doc = yaml.safe_load(result.stdout)
    profile, _prefill = doc["schedulingProfiles"]
    assert profile["name"] == "decode"
    assert doc["disaggregation"]["coordinator"] == "nixl"
    weights = {p["pluginRef"]: p.get("weight") for p in profile["plugins"]}
    assert weights["prefix-cache-scorer"] == 3 and weights["queue-scorer"] == 2
    assert doc["latencyModel"]["maxNumSeqs"] is None
    # the copy in the docs is this output, byte for byte
    assert configcmd.docs_block((DOCS / "configuration.md").read_text()) == result.stdout


def test_show_fills_defaults_into_a_partial_file(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("dataLayer: {staleAfterSeconds: 5}\n")
    doc = yaml.safe_load(epp("config", "show", "--config", str(config)).stdout)
    assert doc["dataLayer"]["staleAfterSeconds"] == 5
    assert doc["dataLayer"]["scrapeIntervalSeconds"] == 0.05


def test_show_rejects_a_bad_file_with_exit_2(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("plugins: [{type: nope}]\n")
    result = epp("config", "show", "--config", str(config))
    assert result.returncode == 2
    assert f"{config}: plugins[0].type: unknown plugin type 'nope'" in result.stderr


def test_plugins_lists_every_type_with_its_kind() -> None:
    lines = epp("config", "plugins").stdout.splitlines()
    kinds = {line.split()[0]: line.split()[1] for line in lines}
    assert kinds["prefix-cache-scorer"] == "scorer"
    assert kinds["max-score-picker"] == "picker"
    assert kinds["single-profile-handler"] == "handler"
