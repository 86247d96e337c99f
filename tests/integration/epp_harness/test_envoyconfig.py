"""Every Envoy config we ship or generate is accepted by the real Envoy binary."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from epp_harness.envoyconfig import (
    EXAMPLES,
    FALLBACK_CLUSTER,
    MAX_RETRIES_UNDER_WAY,
    MODEL_CLUSTER,
    EnvoyOptions,
    baseline_config,
    client_routed_config,
    epp_config,
    render_example,
)
from epp_harness.envoyproc import validate, write_config

ENVOY_DIR = Path(__file__).resolve().parents[3] / "envoy"


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_committed_config_is_current_and_valid(name: str) -> None:
    path = ENVOY_DIR / name
    assert path.read_text() == render_example(name), (
        f"envoy/{name} is stale: run `.venv/bin/python -m epp_harness.envoyconfig envoy/`"
    )
    validate(path)


def test_generated_configs_are_valid(tmp_path: Path) -> None:
    opts = EnvoyOptions(listen_port=0, admin_port=0, epp_port=12345, processing="lean")
    validate(write_config(epp_config(opts), tmp_path / "epp.yaml"))
    tls = replace(opts, epp_tls=True, cluster="original-dst")
    validate(write_config(epp_config(tls), tmp_path / "epp-tls.yaml"))
    base = baseline_config(opts, [("127.0.0.1", 1), ("127.0.0.1", 2)])
    validate(write_config(base, tmp_path / "base.yaml"))
    routed = client_routed_config(opts)
    assert [f["name"] for f in http_filters(routed)] == ["envoy.filters.http.router"]  # no EPP
    validate(write_config(routed, tmp_path / "client-routed.yaml"))


def http_filters(config: dict[str, Any]) -> list[dict[str, Any]]:
    listener = config["static_resources"]["listeners"][0]
    hcm: dict[str, Any] = listener["filter_chains"][0]["filters"][0]["typed_config"]
    filters: list[dict[str, Any]] = hcm["http_filters"]
    return filters


def test_epp_tls_puts_the_epp_cluster_on_unverified_tls() -> None:
    clusters = {
        c["name"]: c for c in epp_config(EnvoyOptions(epp_tls=True))["static_resources"]["clusters"]
    }
    tls = clusters["epp"]["transport_socket"]["typed_config"]
    assert tls["@type"].endswith("UpstreamTlsContext")
    assert tls["common_tls_context"] == {"alpn_protocols": ["h2"]}  # no validation context
    assert "transport_socket" not in clusters["model_servers"]  # model servers stay plain
    plain = epp_config(EnvoyOptions())["static_resources"]["clusters"]
    assert all("transport_socket" not in c for c in plain)


def test_invalid_config_is_reported_with_envoys_words(tmp_path: Path) -> None:
    config = epp_config(EnvoyOptions())
    config["static_resources"]["clusters"][0]["type"] = "NOT_A_TYPE"
    from epp_harness.procs import ProcessFailed

    with pytest.raises(ProcessFailed, match="NOT_A_TYPE"):
        validate(write_config(config, tmp_path / "bad.yaml"))


def test_fail_open_adds_the_fallback_route_first(tmp_path: Path) -> None:
    servers = (("127.0.0.1", 8000), ("127.0.0.1", 8001))
    opts = EnvoyOptions(processing="buffered", failure_mode_allow=True, fallback_servers=servers)
    config = epp_config(opts)
    [ext_proc] = [f for f in http_filters(config) if f["name"] == "envoy.filters.http.ext_proc"]
    assert ext_proc["typed_config"]["failure_mode_allow"] is True
    hcm = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    routes = hcm["typed_config"]["route_config"]["virtual_hosts"][0]["routes"]
    first = routes[0]
    assert first["match"]["headers"] == [
        {"name": "x-gateway-destination-endpoint", "present_match": True, "invert_match": True}
    ]
    assert first["route"]["cluster"] == FALLBACK_CLUSTER
    clusters = {c["name"]: c for c in config["static_resources"]["clusters"]}
    assert len(clusters[FALLBACK_CLUSTER]["load_assignment"]["endpoints"][0]["lb_endpoints"]) == 2
    validate(write_config(config, tmp_path / "fail-open.yaml"))
    # without fallback servers (eds): the model-server cluster, no pick
    no_list = epp_config(replace(opts, fallback_servers=()))
    hcm = no_list["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    assert (
        hcm["typed_config"]["route_config"]["virtual_hosts"][0]["routes"][0]["route"]["cluster"]
        == "model_servers"
    )
    validate(write_config(no_list, tmp_path / "fail-open-eds.yaml"))


@pytest.mark.parametrize(
    ("opts", "message"),
    [
        (EnvoyOptions(failure_mode_allow=True), "needs processing 'buffered'"),
        (
            EnvoyOptions(processing="buffered", failure_mode_allow=True, cluster="original-dst"),
            "original-dst cluster needs fallback servers",
        ),
    ],
)
def test_fail_open_configs_that_cannot_work_are_refused(opts: EnvoyOptions, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        epp_config(opts)


def test_more_epps_join_the_ext_proc_cluster_after_the_first(tmp_path: Path) -> None:
    opts = EnvoyOptions(listen_port=0, admin_port=0, epp_port=9002, more_epps=(("10.0.0.2", 9102),))
    config = epp_config(opts)
    clusters = {c["name"]: c for c in config["static_resources"]["clusters"]}
    lb = clusters["epp"]["load_assignment"]["endpoints"][0]["lb_endpoints"]
    ports = [e["endpoint"]["address"]["socket_address"]["port_value"] for e in lb]
    assert ports == [9002, 9102]
    validate(write_config(config, tmp_path / "two-epps.yaml"))


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_clusters_that_retry_allow_more_than_envoys_three_retries_under_way(name: str) -> None:
    """Envoy's default circuit breaker lets 3 retries run at once per cluster: a burst of
    requests on a server that died failed past the third (scenario seed 1156)."""
    clusters = yaml.safe_load(render_example(name))["static_resources"]["clusters"]
    breakers = {c["name"]: c.get("circuit_breakers") for c in clusters}
    expected = {"thresholds": [{"priority": "DEFAULT", "max_retries": MAX_RETRIES_UNDER_WAY}]}
    assert breakers[MODEL_CLUSTER] == expected
    if name == "local-2-workers.yaml":  # several EPPs: a dead one's streams are retried
        assert breakers["epp"] == expected
    if FALLBACK_CLUSTER in breakers:
        assert breakers[FALLBACK_CLUSTER] == expected
