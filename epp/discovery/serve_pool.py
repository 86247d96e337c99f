"""What ``epp serve`` needs for Kubernetes InferencePool discovery: its flags, and
the discovery source that follows the pool, holding gRPC readiness until its first full
sync.

Kept apart from :mod:`epp.discovery.kubernetes` so that ``epp serve`` imports the
Kubernetes client (~0.45 s of start-up) only when a pool is asked for.
"""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

from epp.discovery.poolref import PoolRef

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


class PoolSource:
    """The discovery source following an InferencePool's pods. Readiness is held back
    (``readiness``, told False at once) until its first full sync, and whenever the pool
    goes away; liveness is not (the process is healthy meanwhile)."""

    def __init__(
        self,
        ref: PoolRef,
        datastore: Datastore,
        default_engine: str,
        readiness: Callable[[bool], Awaitable[None]],
    ) -> None:
        self.ref = ref
        self._datastore = datastore
        self._engine = default_engine
        self._readiness = readiness
        self._discovery: PoolDiscovery | None = None

    async def start(self) -> None:
        """Connect to the API server and start following the pool (before the gRPC port
        opens, so a probe never sees the pool-less default); OSError if the client
        config cannot be read."""
        from epp.discovery.kubernetes import start_pool_discovery

        self._discovery = await start_pool_discovery(
            self.ref, self._datastore, self._engine, on_ready=self._readiness
        )

    async def stop(self) -> None:
        if self._discovery is not None:
            await self._discovery.stop()
