"""Which InferencePool ``epp serve`` follows, and the namespace it is in (found as
kubectl finds it). Apart from :mod:`epp.discovery.kubernetes`, which uses it, so that the
flags can name a pool without importing the Kubernetes client."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import yaml

IN_CLUSTER_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


@dataclass(frozen=True, slots=True)
class PoolRef:
    """Which pool to follow and how to reach the API server."""

    name: str
    namespace: str | None = None  # None: see resolved_namespace
    kubeconfig: Path | None = None

    def resolved_namespace(self) -> str:
        """As kubectl: the flag, else the pod's own namespace in a cluster (when no
        kubeconfig is given), else the kubeconfig's current context's, else default."""
        if self.namespace:
            return self.namespace
        if self.kubeconfig is None and IN_CLUSTER_NAMESPACE.exists():
            return IN_CLUSTER_NAMESPACE.read_text().strip()
        path = self.kubeconfig or default_kubeconfig()
        try:
            text = path.read_text() if path is not None else ""
        except OSError:
            text = ""  # the client reports an unreadable kubeconfig when it loads it
        return context_namespace(text) or "default"


def default_kubeconfig() -> Path | None:
    """The kubeconfig the client loads without --kubeconfig: $KUBECONFIG's first file,
    else ~/.kube/config."""
    env = os.environ.get("KUBECONFIG", "")
    first = next((p for p in env.split(os.pathsep) if p), None)
    return Path(first) if first else Path.home() / ".kube" / "config"


def context_namespace(kubeconfig_text: str) -> str | None:
    """The namespace of a kubeconfig's current context, if it names one (a file that is
    not a kubeconfig yields None: the client reports it when it loads the file)."""
    try:
        doc = yaml.safe_load(kubeconfig_text)
    except yaml.YAMLError:
        return None
    if not isinstance(doc, dict):
        return None
    current = doc.get("current-context")
    for entry in doc.get("contexts") or []:
        if isinstance(entry, dict) and entry.get("name") == current:
            context = entry.get("context")
            namespace = context.get("namespace") if isinstance(context, dict) else None
            return namespace if isinstance(namespace, str) and namespace else None
    return None
