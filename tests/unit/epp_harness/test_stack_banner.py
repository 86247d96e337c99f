"""What `epp stack`'s banner says about the config in use and the P/D coordinator."""

from __future__ import annotations

from pathlib import Path

from epp_harness.stack import StackOptions, _config_in_use, _coordinator


def test_the_coordinator_is_named_only_with_prefill_servers() -> None:
    assert _coordinator(StackOptions(prefill=2, decode=2), ", ") == ", coordinator nixl"
    assert _coordinator(StackOptions(prefill=1, decode=1, coordinator="sidecar"), "; ") == (
        "; coordinator sidecar"
    )
    assert _coordinator(StackOptions(servers=4), ", ") == ""
    assert _coordinator(StackOptions(decode=2), ", ") == ""


def test_the_config_in_use() -> None:
    work = Path("/tmp/work")
    assert _config_in_use(StackOptions(), work) == "built in (`epp config show`)"
    given = StackOptions(epp_args=["--transport", "grpclib", "--config", "configs/x.yaml"])
    assert _config_in_use(given, work) == "configs/x.yaml"
    kv = StackOptions(epp_args=["--config", "configs/x.yaml"], kv_events=True)
    assert _config_in_use(kv, work) == (
        "/tmp/work/epp-config.yaml (configs/x.yaml, with the simulators' KV events)"
    )
