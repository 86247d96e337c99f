"""docker-compose.yml + Dockerfile: no Docker engine runs here, so check what can be
checked without one: every command line parses with our real CLI parsers, and names,
addresses, ports and files agree with each other, envoy/compose.yaml and the Dockerfile.
(envoy/compose.yaml itself is validated by the real Envoy binary in
tests/integration/epp_harness/test_envoyconfig.py.)"""

from __future__ import annotations

import ipaddress
import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from epp.cli import build_parser
from epp.types import Role
from epp_harness.stack import SIM_CONNECTOR

ROOT = Path(__file__).resolve().parents[3]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
# the stack itself; the `monitoring` profile's Prometheus and Grafana are checked apart
SERVICES: dict[str, Any] = {
    name: s for name, s in COMPOSE["services"].items() if "profiles" not in s
}
MONITORING: dict[str, Any] = {
    name: s for name, s in COMPOSE["services"].items() if "monitoring" in s.get("profiles", [])
}
SIMS = ["prefill-1", "prefill-2", "decode-1", "decode-2"]


def dockerfile() -> dict[str, list[str]]:
    """Instruction -> its arguments, one entry per line (no continuation lines used)."""
    out: dict[str, list[str]] = {}
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            op, _, rest = line.strip().partition(" ")
            out.setdefault(op.upper(), []).append(rest)
    return out


DOCKERFILE = dockerfile()
ENTRYPOINT: list[str] = json.loads(DOCKERFILE["ENTRYPOINT"][0])
ENVOY = yaml.safe_load((ROOT / "envoy" / "compose.yaml").read_text())


def parsed(service: str) -> Any:
    """The service's command through the real parser of the subcommand it runs."""
    argv = SERVICES[service]["command"]
    assert "entrypoint" not in SERVICES[service] and ENTRYPOINT == ["epp"]
    try:
        return build_parser(argv[0]).parse_args(argv)
    except SystemExit:
        pytest.fail(f"{service}: `epp {shlex.join(argv)}` does not parse")


def network_address(service: str) -> str:
    return str(SERVICES[service]["networks"]["inference"]["ipv4_address"])


def published(service: str) -> set[int]:
    ports = set()
    for mapping in SERVICES[service].get("ports", []):
        host, _, container = mapping.partition(":")
        assert host == container, f"{service}: same port inside and out keeps the docs simple"
        ports.add(int(container))
    return ports


def test_the_services_are_envoy_the_epp_and_two_prefill_two_decode() -> None:
    assert sorted(SERVICES) == sorted(["envoy", "epp", *SIMS])
    for name, service in SERVICES.items():
        assert service["image"] == "epp:dev", name


def test_the_image_is_built_once_and_never_pulled() -> None:
    # one service builds epp:dev (`up --build`); the others use it as built, so Compose
    # neither builds the same image once per service nor asks a registry for it
    assert [name for name, s in SERVICES.items() if "build" in s] == ["epp"]
    assert SERVICES["epp"]["build"] == "."
    assert {s["pull_policy"] for s in SERVICES.values()} == {"never"}


def probed_url(service: str) -> str:
    """The URL the service's health check opens: a `python -c` urllib probe, since the
    image has python and no curl."""
    test = SERVICES[service]["healthcheck"]["test"]
    assert test[:3] == ["CMD", "python", "-c"], service
    compile(test[3], f"{service} healthcheck", "exec")
    match = re.search(r"urlopen\('([^']+)'", test[3])
    assert match, test[3]
    return match.group(1)


def test_every_service_is_health_checked_where_it_serves() -> None:
    for name in SIMS:
        args = parsed(name)
        assert probed_url(name) == f"http://{args.host}:{args.port}/health"
    assert probed_url("epp") == f"http://127.0.0.1:{parsed('epp').http_port}/health"
    admin = ENVOY["admin"]["address"]["socket_address"]["port_value"]
    assert probed_url("envoy") == f"http://127.0.0.1:{admin}/ready"


def test_each_service_starts_once_what_it_needs_is_healthy() -> None:
    needs = {"envoy": {"epp"}, "epp": set(SIMS)}
    for name, service in SERVICES.items():
        depends = service.get("depends_on", {})
        assert set(depends) == needs.get(name, set()), name
        assert all(d == {"condition": "service_healthy"} for d in depends.values()), name


def test_dockerfile_installs_the_package_and_copies_only_what_exists() -> None:
    for copy in DOCKERFILE["COPY"]:
        *sources, _dest = copy.split()
        for source in sources:
            assert (ROOT / source).exists(), f"Dockerfile copies missing {source}"
    assert any("pip install" in run and " ." in run for run in DOCKERFILE["RUN"])
    cmd = json.loads(DOCKERFILE["CMD"][0])
    build_parser(cmd[0]).parse_args(cmd)  # the default command parses too
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".venv" in ignored and ".git" in ignored


def test_simulators_listen_on_their_fixed_addresses_in_their_role() -> None:
    subnet = ipaddress.ip_network(COMPOSE["networks"]["inference"]["ipam"]["config"][0]["subnet"])
    addresses = set()
    for name in SIMS:
        args = parsed(name)
        assert args.command == "sim" and args.port == 8000 and args.instance_id == name
        # bound to (and so advertising to NIXL peers) its own network address
        assert args.host == network_address(name)
        assert ipaddress.ip_address(args.host) in subnet
        assert Role.parse(args.role) is Role.parse(name.split("-")[0])
        addresses.add(args.host)
    assert len(addresses) == len(SIMS)


def test_epp_routes_to_exactly_the_simulators_in_their_roles() -> None:
    args = parsed("epp")
    assert args.command == "serve" and args.listen_host == "0.0.0.0"
    # the EPP names endpoints by IP (EDS, routing header): each is a simulator's fixed address
    targets = {(e.address, e.role) for e in args.endpoints}
    assert targets == {
        (f"{network_address(n)}:{parsed(n).port}", Role.parse(parsed(n).role)) for n in SIMS
    }
    assert set(SERVICES["epp"]["depends_on"]) == set(SIMS)
    assert published("epp") == {args.http_port}


def test_simulators_speak_the_coordinators_kv_connector() -> None:
    coordinator = parsed("epp").coordinator
    assert {parsed(n).kv_connector for n in SIMS} == {SIM_CONNECTOR[coordinator]}


def test_envoy_config_matches_the_epp_service_and_published_ports() -> None:
    envoy = SERVICES["envoy"]
    assert envoy["entrypoint"] == ["envoy"]
    command = envoy["command"]
    config_path = command[command.index("-c") + 1]
    assert "--disable-hot-restart" in command
    (volume,) = envoy["volumes"]
    source, target, _mode = volume.split(":")
    assert target == config_path
    assert (ROOT / source).resolve() == ROOT / "envoy" / "compose.yaml"

    (epp_cluster,) = [c for c in ENVOY["static_resources"]["clusters"] if c["name"] == "epp"]
    (group,) = epp_cluster["load_assignment"]["endpoints"]
    (lb,) = group["lb_endpoints"]
    socket = lb["endpoint"]["address"]["socket_address"]
    assert socket["address"] in SERVICES  # the EPP's compose service name
    assert socket["port_value"] == parsed(socket["address"]).grpc_port

    (listener,) = ENVOY["static_resources"]["listeners"]
    listen = listener["address"]["socket_address"]
    admin = ENVOY["admin"]["address"]["socket_address"]
    assert listen["address"] == admin["address"] == "0.0.0.0"
    assert published("envoy") == {listen["port_value"], admin["port_value"]}
    assert set(envoy["depends_on"]) == {"epp"}


def test_dockerfile_exposes_every_port_in_use() -> None:
    exposed = {int(p) for line in DOCKERFILE["EXPOSE"] for p in line.split()}
    epp = parsed("epp")
    in_use = {epp.grpc_port, epp.http_port, *published("envoy"), *(parsed(n).port for n in SIMS)}
    assert in_use <= exposed


def test_the_monitoring_profile_scrapes_the_epp_and_provisions_the_dashboard() -> None:
    assert sorted(COMPOSE["services"]) == sorted([*SERVICES, *MONITORING])
    assert sorted(MONITORING) == ["grafana", "prometheus"]
    prometheus, grafana = MONITORING["prometheus"], MONITORING["grafana"]
    mounts = {m.split(":")[1]: ROOT / m.split(":")[0] for m in prometheus["volumes"]}
    scrape = yaml.safe_load(mounts["/etc/prometheus/prometheus.yml"].read_text())
    (job,) = scrape["scrape_configs"]
    assert job["static_configs"][0]["targets"] == [f"epp:{parsed('epp').http_port}"]
    assert prometheus["depends_on"] == {"epp": {"condition": "service_healthy"}}
    mounts = {m.split(":")[1]: ROOT / m.split(":")[0] for m in grafana["volumes"]}
    assert sorted(mounts["/var/lib/grafana/dashboards"].glob("*.json"))  # the dashboard
    provisioning = mounts["/etc/grafana/provisioning"]
    (source,) = yaml.safe_load((provisioning / "datasources" / "prometheus.yaml").read_text())[
        "datasources"
    ]
    assert source["type"] == "prometheus" and source["isDefault"]
    assert source["url"] == "http://prometheus:9090"  # the container's own port
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "epp.yaml").read_text())[
        "providers"
    ]
    assert provider["options"]["path"] == "/var/lib/grafana/dashboards"
