"""Every Envoy config we ship or generate is accepted by the real Envoy binary."""

from __future__ import annotations

from pathlib import Path

import pytest

from epp.envoyconfig import EXAMPLES, EnvoyOptions, baseline_config, epp_config, render_example
from epp.envoyproc import validate, write_config

ENVOY_DIR = Path(__file__).resolve().parents[2] / "envoy"


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_committed_config_is_current_and_valid(name: str) -> None:
    path = ENVOY_DIR / name
    assert path.read_text() == render_example(name), (
        f"envoy/{name} is stale: run `.venv/bin/python -m epp.envoyconfig envoy/`"
    )
    validate(path)


def test_generated_configs_are_valid(tmp_path: Path) -> None:
    opts = EnvoyOptions(listen_port=0, admin_port=0, epp_port=12345, processing="lean")
    validate(write_config(epp_config(opts), tmp_path / "epp.yaml"))
    base = baseline_config(opts, [("127.0.0.1", 1), ("127.0.0.1", 2)])
    validate(write_config(base, tmp_path / "base.yaml"))


def test_invalid_config_is_reported_with_envoys_words(tmp_path: Path) -> None:
    config = epp_config(EnvoyOptions())
    config["static_resources"]["clusters"][0]["type"] = "NOT_A_TYPE"
    from epp.procs import ProcessFailed

    with pytest.raises(ProcessFailed, match="NOT_A_TYPE"):
        validate(write_config(config, tmp_path / "bad.yaml"))
