"""Discovery sources: what feeds the datastore its endpoints, behind one small Protocol,
and the registry ``epp serve`` picks them from.

Each registered :class:`DiscoveryKind` is asked, at build time, whether the flags and
config call for its source (its ``create`` returns one, or None). Built in:

* ``static``: the servers ``--decode/--prefill/--endpoint/...`` and the config file's
  ``endpoints`` name (:class:`~epp.discovery.static.StaticSource`);
* ``endpoints-file``: the servers ``--endpoints-file`` lists, followed as it changes
  (:class:`~epp.discovery.file_source.FileSource`);
* ``kubernetes``: an InferencePool's pods, with ``--pool-name``
  (:class:`~epp.discovery.serve_pool.PoolSource`);
* ``kubernetes-selector``: the pods ``--endpoint-selector`` matches, on
  ``--endpoint-target-ports`` (the llm-d Router's standalone mode; the same source);
* ``admin-api``: ``POST /instances/add`` and ``/remove`` on the HTTP port, and the
  ``--state-file`` they keep (:class:`~epp.discovery.runtime.RuntimeMembership`); always on.

Installed packages add kinds through the ``epp.discovery`` entry-point group
(:mod:`epp.common.extensions`, docs/extending.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from aiohttp import web

from epp.admin.auth import ApiKeyAuth
from epp.admin.instances import add_membership_routes
from epp.common.extensions import Installed, OpenRegistry, instance_of
from epp.common.health import ReadinessGate
from epp.datastore import Datastore
from epp.discovery.file_source import DEFAULT_POLL_S, FileSource
from epp.discovery.names import NameResolver
from epp.discovery.poolref import PoolRef, SelectorRef
from epp.discovery.runtime import Check, RuntimeMembership
from epp.discovery.serve_pool import PoolSource
from epp.discovery.static import StaticSource
from epp.flowcontrol.saturation import WatchedObjectives
from epp.serving.membershipflags import MembershipOptions
from epp.types import Endpoint


class DiscoverySource(Protocol):
    """Adds endpoints to the datastore (and removes the ones it added) from somewhere."""

    async def start(self) -> None:
        """Begin: add what is known now, follow changes in tasks of its own. Raises
        OSError if it cannot (the EPP then does not start)."""
        ...

    async def stop(self) -> None:
        """Stop following (the endpoints may stay: the process is ending)."""
        ...


@dataclass(frozen=True)
class DiscoveryContext:
    """What a source may use, and what the flags and config say."""

    datastore: Datastore  # where endpoints go
    names: NameResolver  # host names to addresses, followed when they move
    readiness: ReadinessGate  # hold(name): keep gRPC readiness back until first synced
    admin: web.Application  # the HTTP port's app: routes may be added (before it starts)
    check: Check  # is a model server ready (GET /health, or /v1/models lists --model)
    engine: str = "vllm"  # engine of endpoints that name none (dataLayer.engine)
    endpoints: tuple[Endpoint, ...] = ()  # named at start: config file, then flags
    endpoints_file: Path | None = None  # --endpoints-file
    endpoints_file_poll_s: float = DEFAULT_POLL_S
    pool: PoolRef | None = None  # --pool-name ...
    selector: SelectorRef | None = None  # --endpoint-selector ...
    membership: MembershipOptions = field(default_factory=MembershipOptions)
    # objective name -> priority, from the pool's InferenceObjectives (the scheduler reads it)
    objectives: WatchedObjectives = field(default_factory=WatchedObjectives)


@dataclass(frozen=True)
class DiscoveryKind:
    """One kind of source, as the registry holds it."""

    summary: str
    # the source the context calls for, or None when the flags and config do not
    create: Callable[[DiscoveryContext], DiscoverySource | None]
    # False: started before the ports open, so Envoy's first connection finds the pool
    # (or readiness held). True: once they listen -- for a source fed through them, so
    # what it does at start (re-checking saved servers) never keeps the ports closed.
    after_listening: bool = False


def _static(ctx: DiscoveryContext) -> StaticSource | None:
    return StaticSource(ctx.endpoints, ctx.names) if ctx.endpoints else None


def _file(ctx: DiscoveryContext) -> FileSource | None:
    if ctx.endpoints_file is None:
        return None
    return FileSource(
        ctx.endpoints_file, ctx.datastore, poll_s=ctx.endpoints_file_poll_s, engine=ctx.engine
    )


def _kubernetes(ctx: DiscoveryContext) -> PoolSource | None:
    if ctx.pool is None:
        return None
    return PoolSource(
        ctx.pool, ctx.datastore, ctx.engine, ctx.readiness.hold("kubernetes"), ctx.objectives
    )


def _selector(ctx: DiscoveryContext) -> PoolSource | None:
    if ctx.selector is None:
        return None
    return PoolSource(ctx.selector, ctx.datastore, ctx.engine, ctx.readiness.hold("selector"))


def _admin_api(ctx: DiscoveryContext) -> RuntimeMembership:
    membership = RuntimeMembership(
        ctx.datastore,
        ctx.check,
        ctx.membership.wait,
        state_file=ctx.membership.state_file,
        engine=ctx.engine,
        resolver=ctx.names,
    )
    auth = ApiKeyAuth(ctx.membership.admin_api_key)
    add_membership_routes(ctx.admin, ctx.datastore, membership, auth, ctx.engine, ctx.names)
    return membership


# by name, in start order; installed packages add more (entry-point group epp.discovery)
DISCOVERY_SOURCES: OpenRegistry[DiscoveryKind] = OpenRegistry(
    {
        "static": DiscoveryKind("servers named by flags and the config file", _static),
        # after static: an address both flags and the file name is the file's
        "endpoints-file": DiscoveryKind("the servers --endpoints-file lists", _file),
        "kubernetes": DiscoveryKind("an InferencePool's pods (--pool-name)", _kubernetes),
        "kubernetes-selector": DiscoveryKind(
            "the pods a label selector matches (--endpoint-selector)", _selector
        ),
        "admin-api": DiscoveryKind(
            "POST /instances/add and /remove, kept in --state-file",
            _admin_api,
            after_listening=True,
        ),
    },
    Installed("epp.discovery", "discovery source kind", instance_of(DiscoveryKind)),
)
