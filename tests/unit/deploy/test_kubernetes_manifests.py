"""deploy/kubernetes/: every manifest parses and the cross-references agree (names,
labels and selectors, ports, RBAC), and the EPP's args parse with our real CLI parser."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from epp import config
from epp.admin.http import make_admin_app
from epp.cli import build_parser
from epp.common.health import HEALTH_SERVICES
from epp.datastore import Datastore
from epp.discovery.pool_endpoints import (
    PORT_DISCOVERY_ANNOTATION,
    ROLE_LABEL,
    parse_pool,
    pod_endpoints,
)
from epp.observability.metrics import EppMetrics
from epp.types import Role

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "deploy" / "kubernetes"
Doc = dict[str, Any]


def load() -> dict[tuple[str, str], Doc]:
    docs: dict[tuple[str, str], Doc] = {}
    for path in sorted(DEPLOY.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            assert {"apiVersion", "kind", "metadata"} <= doc.keys(), path
            assert "namespace" not in doc["metadata"], f"{path}: apply into any namespace"
            key = (doc["kind"], doc["metadata"]["name"])
            assert key not in docs, f"{path}: {key} defined twice"
            docs[key] = doc
    return docs


DOCS = load()
EPP = DOCS[("Deployment", "qwen-epp")]
POOL = DOCS[("InferencePool", "qwen-pool")]
MODEL_SERVERS = [DOCS[("Deployment", "qwen-prefill")], DOCS[("Deployment", "qwen-decode")]]


def epp_args() -> Any:
    (container,) = EPP["spec"]["template"]["spec"]["containers"]
    return build_parser("serve").parse_args(container["args"])


def admin_app() -> web.Application:
    datastore = Datastore()
    return make_admin_app(datastore, EppMetrics(datastore), ready=lambda: True)


def container_ports(deployment: Doc) -> dict[str, int]:
    return {
        p.get("name", str(p["containerPort"])): p["containerPort"]
        for c in deployment["spec"]["template"]["spec"]["containers"]
        for p in c.get("ports", [])
    }


def selects(match_labels: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in match_labels.items())


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    files = {p.name for p in DEPLOY.glob("*.yaml")} - {"kustomization.yaml"}
    assert sorted(kustomization["resources"]) == sorted(files)


def test_rbac_grants_exactly_what_discovery_uses() -> None:
    rules = {
        (group, resource): sorted(rule["verbs"])
        for rule in DOCS[("Role", "qwen-epp")]["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }
    assert rules == {
        ("", "pods"): ["get", "list", "watch"],
        ("inference.networking.k8s.io", "inferencepools"): ["get", "list", "watch"],
        ("inference.networking.x-k8s.io", "inferenceobjectives"): ["get", "list", "watch"],
        ("", "events"): ["create"],
        ("coordination.k8s.io", "leases"): ["create", "get", "update"],  # leader election
    }
    binding = DOCS[("RoleBinding", "qwen-epp")]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "qwen-epp",
    }
    (subject,) = binding["subjects"]
    assert (subject["kind"], subject["name"]) in DOCS
    assert EPP["spec"]["template"]["spec"]["serviceAccountName"] == subject["name"]


def test_epp_args_ports_probes_and_service_agree() -> None:
    args = epp_args()
    assert args.listen_host == "0.0.0.0"  # reachable from other pods
    assert args.pool_name == POOL["metadata"]["name"]
    assert args.pool_namespace is None  # the pod's own namespace, like the pool's
    ports = container_ports(EPP)
    assert ports == {"grpc": args.grpc_port, "http": args.http_port, "peer-load": 9004}
    assert (args.grpc_port, args.http_port) == (9002, 9090)
    (container,) = EPP["spec"]["template"]["spec"]["containers"]
    tls = args.tls_self_signed or args.tls_cert_file is not None
    routes = {r.resource.canonical for r in admin_app().router.routes() if r.resource}
    for probe in ("readinessProbe", "livenessProbe"):
        if "grpc" in container[probe]:  # kubelet's gRPC probes speak plaintext only
            assert not tls, f"{probe}: a gRPC probe cannot reach a TLS port"
            grpc = container[probe]["grpc"]
            assert grpc["port"] == args.grpc_port and grpc["service"] in HEALTH_SERVICES
        else:
            get = container[probe]["httpGet"]
            assert ports[get["port"]] == args.http_port and get["path"] in routes
    # a read-only root filesystem: nothing in these arguments writes a file (the TLS
    # key goes through memfd: tests/unit/epp/extproc/test_tls.py)
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert args.state_file is None and args.ready_file is None
    ready = container["readinessProbe"]
    assert ready.get("grpc", {}).get("service") == "readiness" or (
        ready["httpGet"]["path"] == "/ready"  # mirrors gRPC readiness (pool synced)
    )

    template_labels = EPP["spec"]["template"]["metadata"]["labels"]
    assert selects(EPP["spec"]["selector"]["matchLabels"], template_labels)
    service = DOCS[("Service", "qwen-epp")]
    assert selects(service["spec"]["selector"], template_labels)
    assert {p["name"]: (p["port"], ports[p["targetPort"]]) for p in service["spec"]["ports"]} == {
        "grpc": (9002, 9002),
        "http": (9090, 9090),
    }


def test_two_replicas_active_active_spread_and_never_all_down() -> None:
    """docs/replicas.md: two replicas, both ready (no leader election), on different
    nodes where possible; a rollout or a drain leaves one serving."""
    assert EPP["spec"]["replicas"] == 2
    assert epp_args().ha_enable_leader_election is False
    assert EPP["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    (spread,) = EPP["spec"]["template"]["spec"]["topologySpreadConstraints"]
    labels = EPP["spec"]["template"]["metadata"]["labels"]
    assert spread["topologyKey"] == "kubernetes.io/hostname"
    assert selects(spread["labelSelector"]["matchLabels"], labels)
    budget = DOCS[("PodDisruptionBudget", "qwen-epp")]
    assert budget["spec"]["minAvailable"] == 1
    assert selects(budget["spec"]["selector"]["matchLabels"], labels)


def test_the_replicas_share_their_in_flight_counts() -> None:
    """docs/replicas.md: each replica publishes its counts on the peer-load port and
    follows every pod of a headless Service that selects the replicas."""
    args = epp_args()
    assert args.peer_load_bind == f"tcp://0.0.0.0:{container_ports(EPP)['peer-load']}"
    (peers,) = args.peer_load_peers
    service = DOCS[("Service", "qwen-epp-peers")]
    assert peers == f"tcp://qwen-epp-peers:{service['spec']['ports'][0]['port']}"
    assert service["spec"]["clusterIP"] == "None"  # a name that lists every pod
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert selects(service["spec"]["selector"], EPP["spec"]["template"]["metadata"]["labels"])
    (port,) = service["spec"]["ports"]
    assert container_ports(EPP)[port["targetPort"]] == port["port"] == 9004


def mounts(container: Doc) -> dict[str, str]:
    return {m["name"]: m["mountPath"] for m in container.get("volumeMounts", [])}


def test_the_replicas_read_kv_events_with_the_shipped_precise_config() -> None:
    """The ConfigMap is configs/precise-prefix.yaml with the tokenizer the init container
    fetches, mounted where --config-file and the tokenizer parameter say."""
    spec = EPP["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    (init,) = spec["initContainers"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    config_map = DOCS[("ConfigMap", volumes["config"]["configMap"]["name"])]
    (key,) = config_map["data"]
    assert Path(epp_args().config) == Path(mounts(container)["config"]) / key
    text = config_map["data"][key]
    shipped = yaml.safe_load((ROOT / "configs" / "precise-prefix.yaml").read_text())
    ours = yaml.safe_load(text)
    (precise,) = [p for p in ours["plugins"] if p["type"] == "precise-prefix-cache-scorer"]
    tokenizer = precise["parameters"].pop("tokenizer")
    assert ours == shipped
    assert tokenizer == mounts(container)["tokenizer"] == mounts(init)["tokenizer"]
    assert "emptyDir" in volumes["tokenizer"]
    assert config.load_text(text, "ConfigMap").plugins  # validates as epp serve would


@pytest.mark.parametrize("deployment", MODEL_SERVERS, ids=lambda d: d["metadata"]["name"])
def test_every_model_server_publishes_where_its_endpoint_says(deployment: Doc) -> None:
    template = deployment["spec"]["template"]
    pod = {
        "metadata": {"name": "p", "namespace": "default", **template["metadata"]},
        "status": {"podIP": "10.0.0.1", "conditions": [{"type": "Ready", "status": "True"}]},
    }
    endpoints = pod_endpoints(parse_pool(POOL), pod, "vllm").endpoints
    published = {}
    for container in template["spec"]["containers"]:
        args = dict(a.split("=", 1) for a in container["args"] if a.startswith("--"))
        events = json.loads(args["--kv-events-config"])
        assert events["enable_kv_cache_events"] is True and events["publisher"] == "zmq"
        published[int(args["--port"])] = events["endpoint"].rsplit(":", 1)[1]
    assert {e.port: e.labels["epp.dev/kv-events"] for e in endpoints} == published
    assert len(set(published.values())) == len(published)  # one port per server in a pod


def test_pool_points_at_the_epp_service() -> None:
    ref = POOL["spec"]["endpointPickerRef"]
    service = DOCS[("Service", ref["name"])]
    grpc_port = next(p["port"] for p in service["spec"]["ports"] if p["name"] == "grpc")
    assert ref["port"]["number"] == grpc_port
    assert ref.get("kind", "Service") == "Service"
    assert ref["failureMode"] in ("FailOpen", "FailClose")


@pytest.mark.parametrize("deployment", MODEL_SERVERS, ids=lambda d: d["metadata"]["name"])
def test_model_servers_become_the_intended_endpoints(deployment: Doc) -> None:
    """A ready pod from each template, run through the real discovery rules."""
    template = deployment["spec"]["template"]
    labels = template["metadata"]["labels"]
    assert selects(deployment["spec"]["selector"]["matchLabels"], labels)
    others = [d for d in MODEL_SERVERS if d is not deployment]
    for other in others:  # no Deployment adopts another's pods
        assert not selects(deployment["spec"]["selector"]["matchLabels"],
                           other["spec"]["template"]["metadata"]["labels"])  # fmt: skip
    pod = {
        "metadata": {"name": "p", "namespace": "default", **template["metadata"]},
        "status": {"podIP": "10.0.0.1", "conditions": [{"type": "Ready", "status": "True"}]},
    }
    result = pod_endpoints(parse_pool(POOL), pod, "vllm")
    assert result.problems == ()
    declared = json.loads(template["metadata"]["annotations"][PORT_DISCOVERY_ANNOTATION])
    assert [e.port for e in result.endpoints] == [d["number"] for d in declared]
    assert {e.role for e in result.endpoints} == {Role.parse(labels[ROLE_LABEL])}
    # every declared port is a port a container listens on (its --port flag)
    listening = {
        int(a.split("=", 1)[1])
        for c in template["spec"]["containers"]
        for a in c["args"]
        if a.startswith("--port=")
    }
    assert (
        {e.port for e in result.endpoints} == listening == set(container_ports(deployment).values())
    )
    for container in template["spec"]["containers"]:
        probe_port = container["readinessProbe"]["httpGet"]["port"]
        assert probe_port in {p["containerPort"] for p in container["ports"]}
        # NIXL: the prefill side tells decode where to pull from; vLLM's default is
        # localhost, so every server must advertise its pod IP
        env = {e["name"]: e for e in container.get("env", [])}
        host = env["VLLM_NIXL_SIDE_CHANNEL_HOST"]["valueFrom"]["fieldRef"]["fieldPath"]
        assert host == "status.podIP"


def test_pool_target_port_is_a_real_server() -> None:
    """The v1 CRD requires targetPorts; gateways that ignore port discovery use it."""
    ports = {p["number"] for p in POOL["spec"]["targetPorts"]}
    listening = {port for d in MODEL_SERVERS for port in container_ports(d).values()}
    assert ports and ports <= listening


def test_route_sends_the_gateway_to_the_pool() -> None:
    route = DOCS[("HTTPRoute", "qwen-route")]
    (parent,) = route["spec"]["parentRefs"]
    assert ("Gateway", parent["name"]) in DOCS
    backends = [b for rule in route["spec"]["rules"] for b in rule["backendRefs"]]
    assert backends == [
        {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "qwen-pool"}
    ]
