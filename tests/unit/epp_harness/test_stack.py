"""The local stack's pure parts (epp_harness.stack)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from epp_harness.procs import ProcessFailed
from epp_harness.stack import kv_events_config

ENDPOINTS = ["--endpoint", "127.0.0.1:8001", "--prefill", "127.0.0.1:8002"]


def test_kv_events_config_lists_the_simulators_with_their_publishers(tmp_path: Path) -> None:
    given = tmp_path / "given.yaml"
    given.write_text(
        "plugins:\n- type: precise-prefix-cache-scorer\n- type: prefix-cache-scorer\n"
        "- type: precise-prefix-cache-scorer\n  name: own\n  parameters: {tokenizer: /mine}\n"
    )
    args = kv_events_config(
        ["--transport", "grpcio", "--config", str(given)],
        ENDPOINTS,
        [5557, 5558],
        tmp_path / "tok",
        tmp_path,
    )
    assert args == ["--transport", "grpcio", "--config", str(tmp_path / "epp-config.yaml")]
    doc = yaml.safe_load((tmp_path / "epp-config.yaml").read_text())
    assert [p.get("parameters") for p in doc["plugins"]] == [
        {"tokenizer": str(tmp_path / "tok")},  # the simulators' tokenizer where none given
        None,
        {"tokenizer": "/mine"},
    ]
    assert doc["endpoints"] == [
        {
            "address": "127.0.0.1:8001",
            "role": "decode",
            "labels": {"epp.dev/kv-events": "127.0.0.1:5557"},
        },
        {
            "address": "127.0.0.1:8002",
            "role": "prefill",
            "labels": {"epp.dev/kv-events": "127.0.0.1:5558"},
        },
    ]


def test_kv_events_config_without_a_file_and_with_endpoints_of_its_own(tmp_path: Path) -> None:
    kv_events_config([], ENDPOINTS, [1, 2], tmp_path / "tok", tmp_path)
    doc = yaml.safe_load((tmp_path / "epp-config.yaml").read_text())
    assert list(doc) == ["endpoints"]  # the built-in default config, plus the endpoints
    given = tmp_path / "given.yaml"
    given.write_text("endpoints: [{address: '10.0.0.1:80'}]\n")
    with pytest.raises(ProcessFailed, match="give no endpoints"):
        kv_events_config(["--config", str(given)], ENDPOINTS, [1, 2], tmp_path, tmp_path)
