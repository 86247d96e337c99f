"""Which InferencePool ``epp serve`` follows (or, without one, which pods: the llm-d
Router's standalone ``--endpoint-selector``), and the namespace it is in (the flag, else
``$NAMESPACE`` as the llm-d Router chart sets it, else as kubectl finds it). Apart from
:mod:`epp.discovery.kubernetes`, which uses it, so that the flags can name a pool
without importing the Kubernetes client."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from epp.common.lazymodule import lazy_module

if TYPE_CHECKING:
    import yaml
else:  # only to read a kubeconfig
    yaml = lazy_module("yaml")

IN_CLUSTER_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
NAMESPACE_ENV = "NAMESPACE"


@dataclass(frozen=True, slots=True)
class PoolRef:
    """Which pool to follow and how to reach the API server."""

    name: str
    namespace: str | None = None  # None: see resolved_namespace
    kubeconfig: Path | None = None

    def resolved_namespace(self) -> str:
        return resolve_namespace(self.namespace, self.kubeconfig)


@dataclass(frozen=True, slots=True)
class SelectorRef:
    """Standalone mode: the pods matching ``match_labels`` in one namespace, each
    serving on ``target_ports``."""

    match_labels: tuple[tuple[str, str], ...]
    target_ports: tuple[int, ...]
    namespace: str | None = None  # None: see resolve_namespace
    kubeconfig: Path | None = None

    @property
    def label_selector(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.match_labels)

    def resolved_namespace(self) -> str:
        return resolve_namespace(self.namespace, self.kubeconfig)


def parse_selector(text: str) -> tuple[tuple[str, str], ...]:
    """``key=value[,key=value...]`` (``==`` too) as sorted pairs; ValueError naming what
    is not supported (set-based and ``!=`` terms) or missing."""
    pairs: dict[str, str] = {}
    for term in (t.strip() for t in text.split(",")):
        if not term:
            continue
        key, sep, value = term.replace("==", "=", 1).partition("=")
        if not sep or "!" in key or not key.strip() or "=" in value:
            raise ValueError(
                f"--endpoint-selector {text!r}: term {term!r} is not key=value "
                "(only equality terms are supported)"
            )
        pairs[key.strip()] = value.strip()
    if not pairs:
        raise ValueError("--endpoint-selector is empty: give key=value[,key=value]")
    return tuple(sorted(pairs.items()))


def resolve_namespace(namespace: str | None, kubeconfig: Path | None) -> str:
    """The flag, else ``$NAMESPACE`` (the llm-d Router chart sets it to the pod's),
    else as kubectl: the pod's own namespace in a cluster (when no kubeconfig is given),
    else the kubeconfig's current context's, else default."""
    if namespace:
        return namespace
    if os.environ.get(NAMESPACE_ENV):
        return os.environ[NAMESPACE_ENV]
    if kubeconfig is None and IN_CLUSTER_NAMESPACE.exists():
        return IN_CLUSTER_NAMESPACE.read_text().strip()
    path = kubeconfig or default_kubeconfig()
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
