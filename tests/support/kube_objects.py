"""Pod, InferencePool and InferenceObjective objects as the Kubernetes API serialises
them (camelCase JSON)."""

from __future__ import annotations

import json
from typing import Any

POOL_API_VERSION = "inference.networking.k8s.io/v1"
OBJECTIVE_API_VERSION = "inference.networking.x-k8s.io/v1alpha2"


def pool(
    name: str = "qwen-pool",
    namespace: str = "default",
    match_labels: dict[str, str] | None = None,
    target_ports: list[int] | None = None,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    return {
        "apiVersion": POOL_API_VERSION,
        "kind": "InferencePool",
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
        "spec": {
            "selector": {"matchLabels": match_labels or {"app": "qwen"}},
            "targetPorts": [{"number": p} for p in (target_ports or [8000])],
            "endpointPickerRef": {"name": "epp", "port": {"number": 9002}},
        },
    }


def pod(
    name: str,
    ip: str = "10.0.0.1",
    *,
    namespace: str = "default",
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    ready: bool = True,
    port_discovery: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    annotations = dict(annotations or {})
    if port_discovery is not None:
        annotations["inference.networking.x-k8s.io/port-discovery"] = json.dumps(port_discovery)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app": "qwen", **(labels or {})},
            "annotations": annotations,
        },
        "spec": {"containers": [{"name": "server", "image": "vllm"}]},
        "status": {
            "phase": "Running",
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def objective(
    name: str,
    priority: object = None,
    *,
    namespace: str = "default",
    pool_ref: str | None = "qwen-pool",
    **spec: Any,
) -> dict[str, Any]:
    """An InferenceObjective (v1alpha2): ``pool_ref`` as the older single ``poolRef``;
    ``spec`` adds fields as written (``poolRefs``, ``poolSelector``)."""
    body: dict[str, Any] = dict(spec)
    if priority is not None:
        body["priority"] = priority
    if pool_ref is not None:
        body["poolRef"] = {"group": "inference.networking.k8s.io", "name": pool_ref}
    return {
        "apiVersion": OBJECTIVE_API_VERSION,
        "kind": "InferenceObjective",
        "metadata": {"name": name, "namespace": namespace},
        "spec": body,
    }
