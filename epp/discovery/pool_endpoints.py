"""Which endpoints an InferencePool's pods make: pure functions over the API's JSON.

Inputs are the objects exactly as the Kubernetes API sends them (camelCase dicts), so
the same code reads list responses and watch events, and tests feed it plain data.
Every problem found in a pod is returned as text naming the pod; nothing here logs.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from epp.datalayer.engines import ENGINES
from epp.errors import InternalError
from epp.types import Endpoint, Role

ROLE_LABEL = "llm-d.ai/role"
ENGINE_KEY = "inference.networking.k8s.io/engine-type"
ACTIVE_PORTS_ANNOTATION = "inference.networking.k8s.io/active-ports"
PORT_DISCOVERY_ANNOTATION = "inference.networking.x-k8s.io/port-discovery"
POOL_GROUP = "inference.networking.k8s.io"
POOL_VERSION = "v1"
POOL_PLURAL = "inferencepools"


class PoolError(InternalError, ValueError):
    """The InferencePool object cannot be used (the message says which field and why)."""


@dataclass(frozen=True, slots=True)
class PoolSpec:
    """The parts of an InferencePool that decide membership."""

    name: str
    namespace: str
    match_labels: Mapping[str, str]
    target_ports: tuple[int, ...] = ()

    @property
    def label_selector(self) -> str:
        """``matchLabels`` as the API's ``labelSelector`` query value."""
        return ",".join(f"{k}={v}" for k, v in sorted(self.match_labels.items()))

    def selects(self, pod: Mapping[str, Any]) -> bool:
        labels = _meta(pod).get("labels") or {}
        return all(labels.get(k) == v for k, v in self.match_labels.items())


@dataclass(frozen=True, slots=True)
class PodEndpoints:
    """One pod's endpoints, and what was wrong with its labels or annotations."""

    endpoints: tuple[Endpoint, ...] = ()
    problems: tuple[str, ...] = field(default=())


def parse_pool(obj: Mapping[str, Any]) -> PoolSpec:
    meta = _meta(obj)
    where = f"InferencePool {meta.get('namespace', '?')}/{meta.get('name', '?')}"
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        raise PoolError(f"{where}: spec is missing")
    selector = spec.get("selector")
    labels = selector.get("matchLabels") if isinstance(selector, Mapping) else None
    if not isinstance(labels, Mapping) or not labels:
        # An empty selector would select every pod in the namespace: refuse rather than guess.
        raise PoolError(f"{where}: spec.selector.matchLabels must be a non-empty map")
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
        raise PoolError(f"{where}: spec.selector.matchLabels must map strings to strings")
    ports: list[int] = []
    for i, entry in enumerate(spec.get("targetPorts") or []):
        number = entry.get("number") if isinstance(entry, Mapping) else None
        if not _is_port(number):
            raise PoolError(f"{where}: spec.targetPorts[{i}].number must be a port 1-65535")
        if number not in ports:
            ports.append(number)
    return PoolSpec(
        name=str(meta.get("name", "")),
        namespace=str(meta.get("namespace", "")),
        match_labels=dict(labels),
        target_ports=tuple(ports),
    )


def pod_name(pod: Mapping[str, Any]) -> str:
    meta = _meta(pod)
    return f"{meta.get('namespace', '?')}/{meta.get('name', '?')}"


def is_ready(pod: Mapping[str, Any]) -> bool:
    """Ready, with an IP, and not terminating (a terminating pod stops taking new work)."""
    if _meta(pod).get("deletionTimestamp"):
        return False
    status = pod.get("status") or {}
    if not status.get("podIP"):
        return False
    conditions = status.get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def pod_endpoints(pool: PoolSpec, pod: Mapping[str, Any], default_engine: str) -> PodEndpoints:
    """The endpoints ``pod`` contributes to ``pool`` (none unless it is selected and ready).

    A pod whose port-discovery annotation has entries for this pool is served on exactly
    those ports; otherwise on the pool's ``targetPorts``, narrowed by the active-ports
    annotation when present. A malformed entry drops only itself.
    """
    if not pool.selects(pod) or not is_ready(pod):
        return PodEndpoints()
    name = pod_name(pod)
    meta = _meta(pod)
    labels: dict[str, str] = dict(meta.get("labels") or {})
    annotations: Mapping[str, str] = meta.get("annotations") or {}
    problems: list[str] = []
    engine = labels.get(ENGINE_KEY) or annotations.get(ENGINE_KEY) or default_engine
    if engine not in ENGINES:
        problems.append(
            f"pod {name}: {ENGINE_KEY} {engine!r} is not a known engine "
            f"({', '.join(sorted(ENGINES))}); using {default_engine!r}"
        )
        engine = default_engine
    declared = _discovered_ports(pool.name, name, annotations, problems)
    if declared is None:
        ports = _active(pool.target_ports, name, annotations, problems)
        declared = [(port, {}) for port in ports]
    host = pod["status"]["podIP"]
    endpoints: list[Endpoint] = []
    for port, attributes in declared:
        role_text = attributes.get("role") or labels.get(ROLE_LABEL)
        try:
            role = Role.parse(role_text) if role_text else Role.DECODE
        except ValueError as exc:
            # An unknown role may be a server type we cannot route to (e.g. an encoder):
            # leave it out rather than send it decode traffic.
            problems.append(f"pod {name} port {port}: {exc}; endpoint left out")
            continue
        endpoints.append(Endpoint(host, port, role, {**labels, **attributes}, engine))
    return PodEndpoints(tuple(endpoints), tuple(problems))


def _discovered_ports(
    pool_name: str, pod: str, annotations: Mapping[str, str], problems: list[str]
) -> list[tuple[int, dict[str, str]]] | None:
    """Port-discovery entries naming ``pool_name``, or None when the pod has no such
    annotation. A pod that has one is described by it alone: an unreadable annotation,
    or one naming only other pools, gives no endpoints here (never the pool's
    targetPorts, where nothing may listen)."""
    text = annotations.get(PORT_DISCOVERY_ANNOTATION)
    if text is None:
        return None
    where = f"pod {pod}: annotation {PORT_DISCOVERY_ANNOTATION}"
    try:
        entries = json.loads(text)
    except ValueError as exc:
        problems.append(f"{where} is not valid JSON ({exc}); no endpoints from this pod")
        return []
    if not isinstance(entries, list):
        problems.append(f"{where} must be a JSON list of ports; no endpoints from this pod")
        return []
    ours: list[tuple[int, dict[str, str]]] = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or not isinstance(entry.get("inferencePool"), str):
            problems.append(f"{where}[{i}] needs an inferencePool name; entry skipped")
            continue
        if entry["inferencePool"] != pool_name:
            continue
        number, attributes = entry.get("number"), entry.get("attributes", {})
        if not _is_port(number):
            problems.append(f"{where}[{i}].number {number!r} is not a port 1-65535; skipped")
        elif not isinstance(attributes, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in attributes.items()
        ):
            problems.append(f"{where}[{i}].attributes must map strings to strings; skipped")
        elif any(number == port for port, _ in ours):
            problems.append(f"{where}[{i}] repeats port {number}; skipped")
        else:
            ours.append((number, attributes))
    return ours


def _active(
    target_ports: tuple[int, ...], pod: str, annotations: Mapping[str, str], problems: list[str]
) -> list[int]:
    text = annotations.get(ACTIVE_PORTS_ANNOTATION)
    if text is None:
        return list(target_ports)
    active: set[int] = set()
    for token in (t.strip() for t in text.split(",")):
        if token.isdigit() and _is_port(int(token)):
            active.add(int(token))
        elif token:
            problems.append(
                f"pod {pod}: annotation {ACTIVE_PORTS_ANNOTATION} entry {token!r} "
                "is not a port; skipped"
            )
    return [p for p in target_ports if p in active]


def _is_port(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value < 65536


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}
