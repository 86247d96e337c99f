"""What ``epp serve`` needs for Kubernetes InferencePool discovery: its flags, and
starting it with gRPC readiness held until the first full sync.

Kept apart from :mod:`epp.discovery.kubernetes` so that ``epp serve`` imports the
Kubernetes client (~0.45 s of start-up) only when a pool is asked for.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from epp.discovery.poolref import PoolRef
from epp.health import LIVENESS, HealthSetter

if TYPE_CHECKING:
    from epp.datastore import Datastore
    from epp.discovery.kubernetes import PoolDiscovery


def pool_ref(args: argparse.Namespace) -> PoolRef | None:
    """The pool the flags name, if any; ValueError if they make no sense together."""
    if args.pool_name is None:
        if args.pool_namespace or args.kubeconfig:
            raise ValueError("--pool-namespace and --kubeconfig need --pool-name")
        return None
    return PoolRef(args.pool_name, args.pool_namespace, args.kubeconfig)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("Kubernetes (see README: Running in Kubernetes)")
    g.add_argument(
        "--pool-name",
        metavar="NAME",
        help="route to the pods of this InferencePool (inference.networking.k8s.io/v1); "
        "gRPC readiness turns SERVING after its first full sync",
    )
    g.add_argument(
        "--pool-namespace",
        metavar="NS",
        help="the InferencePool's namespace (default: the EPP pod's own namespace in a "
        "cluster, else the kubeconfig's current context's namespace, else 'default')",
    )
    g.add_argument(
        "--kubeconfig",
        type=Path,
        metavar="PATH",
        help="kubeconfig for --pool-name (default: the pod's service account in a cluster, "
        "else $KUBECONFIG or ~/.kube/config)",
    )


async def start(
    ref: PoolRef | None, datastore: Datastore, default_engine: str, health: HealthSetter
) -> list[PoolDiscovery]:
    """Set the health statuses and, with a pool, start following it (before the gRPC port
    opens, so a probe never sees the pool-less default). Returns what to stop later."""
    # Without a pool the endpoints are known now; with one, readiness waits for its first
    # full sync (liveness does not: the process is healthy meanwhile).
    await health.set_serving(ref is None)
    await health.set_serving(True, [LIVENESS])
    if ref is None:
        return []
    from epp.discovery.kubernetes import start_pool_discovery

    async def readiness(ready: bool) -> None:
        # follows the pool: ready once it and its pods are listed, not while it is gone
        await health.set_serving(ready)
        await health.set_serving(True, [LIVENESS])

    discovery = await start_pool_discovery(ref, datastore, default_engine, on_ready=readiness)
    return [discovery]
