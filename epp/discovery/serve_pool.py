"""What ``epp serve`` needs for Kubernetes discovery: its flags (an InferencePool, or
the llm-d Router's standalone ``--endpoint-selector``), and the discovery sources that
follow the pool or the selected pods, holding gRPC readiness until their first full
sync.

Kept apart from :mod:`epp.discovery.kubernetes` so that ``epp serve`` imports the
Kubernetes client (~0.45 s of start-up) only when a pool is asked for.
"""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

from epp.common.argtypes import comma_ports
from epp.discovery.pool_endpoints import POOL_GROUP
from epp.discovery.poolref import PoolRef, SelectorRef, parse_selector

if TYPE_CHECKING:
    from epp.datastore import Datastore
    from epp.discovery.kubernetes import PoolDiscovery
    from epp.flowcontrol.saturation import WatchedObjectives


def pool_ref(args: argparse.Namespace) -> PoolRef | None:
    """The pool the flags name, if any; ValueError if they make no sense together."""
    if args.pool_group != POOL_GROUP:
        raise ValueError(
            f"--pool-group {args.pool_group!r}: only {POOL_GROUP} (v1) InferencePools are read"
        )
    if args.pool_name is None:
        if args.endpoint_selector is None and args.pool_namespace:
            raise ValueError("--pool-namespace needs --pool-name or --endpoint-selector")
        if args.endpoint_selector is None and args.kubeconfig and not args.metrics_endpoint_auth:
            raise ValueError(
                "--kubeconfig needs --pool-name, --endpoint-selector or --metrics-endpoint-auth"
            )
        return None
    if args.endpoint_selector is not None:
        raise ValueError("--pool-name and --endpoint-selector exclude each other: give one")
    return PoolRef(args.pool_name, args.pool_namespace, args.kubeconfig)


def selector_ref(args: argparse.Namespace) -> SelectorRef | None:
    """The standalone pods the flags select, if any; ValueError if the flags are
    incomplete or the selector unsupported."""
    if args.endpoint_selector is None:
        if args.endpoint_target_ports is not None:
            raise ValueError("--endpoint-target-ports needs --endpoint-selector")
        return None
    if not args.endpoint_target_ports:
        raise ValueError("--endpoint-selector needs --endpoint-target-ports (e.g. 8000)")
    labels = parse_selector(args.endpoint_selector)
    return SelectorRef(labels, args.endpoint_target_ports, args.pool_namespace, args.kubeconfig)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("Kubernetes", "see docs/operations.md, Running in Kubernetes")
    g.add_argument(
        "--pool-name",
        metavar="NAME",
        help="route to the pods of this InferencePool (inference.networking.k8s.io/v1); "
        "gRPC readiness turns SERVING after its first full sync",
    )
    g.add_argument(
        "--pool-namespace",
        metavar="NS",
        help="the InferencePool's (or selected pods') namespace (default: $NAMESPACE, else "
        "the EPP pod's own namespace in a cluster, else the kubeconfig's current "
        "context's namespace, else 'default')",
    )
    g.add_argument(
        "--pool-group",
        default=POOL_GROUP,
        metavar="GROUP",
        help="llm-d Router flag: the InferencePool's API group (only this one is read)",
    )
    g.add_argument(
        "--endpoint-selector",
        metavar="SELECTOR",
        help="llm-d Router standalone mode, instead of --pool-name: route to the ready pods "
        "whose labels match key=value[,key=value] (equality terms only)",
    )
    g.add_argument(
        "--endpoint-target-ports",
        type=comma_ports,
        metavar="PORTS",
        help="with --endpoint-selector: the ports each selected pod serves on, e.g. 8000,8001",
    )
    g.add_argument(
        "--kubeconfig",
        type=Path,
        metavar="PATH",
        help="kubeconfig for --pool-name, --endpoint-selector and --metrics-endpoint-auth "
        "(default: the pod's service account in a cluster, else $KUBECONFIG or "
        "~/.kube/config)",
    )


class PoolSource:
    """The discovery source following an InferencePool's pods (or, with a
    :class:`SelectorRef`, the pods a label selector matches). Readiness is held back
    (``readiness``, told False at once) until its first full sync, and whenever the pool
    goes away; liveness is not (the process is healthy meanwhile). The pool's
    InferenceObjectives' priorities go into ``objectives``."""

    def __init__(
        self,
        ref: PoolRef | SelectorRef,
        datastore: Datastore,
        default_engine: str,
        readiness: Callable[[bool], Awaitable[None]],
        objectives: WatchedObjectives | None = None,
    ) -> None:
        self.ref = ref
        self._objectives = objectives
        self._datastore = datastore
        self._engine = default_engine
        self._readiness = readiness
        self._discovery: PoolDiscovery | None = None

    async def start(self) -> None:
        """Connect to the API server and start following the pool (before the gRPC port
        opens, so a probe never sees the pool-less default); OSError if the client
        config cannot be read."""
        from epp.discovery.kubernetes import start_discovery

        self._discovery = await start_discovery(
            self.ref,
            self._datastore,
            self._engine,
            on_ready=self._readiness,
            objectives=self._objectives,
        )

    async def stop(self) -> None:
        if self._discovery is not None:
            await self._discovery.stop()
