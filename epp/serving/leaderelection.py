"""``--ha-enable-leader-election`` (docs/replicas.md): replicas contend for one
``coordination.k8s.io/v1`` Lease and only its holder reports ready (gRPC readiness and
HTTP ``/ready``), so the EPP's Service sends traffic to the leader alone: the llm-d
Router's active-passive meaning of the flag. Every replica keeps following the pool,
scraping and reading KV events meanwhile (a hot standby), and serves whatever reaches it.

The rules, as Kubernetes' own controllers apply them:

* a lease is free when it names no holder, or when its record (holder, renew time,
  transitions) has not changed for the lease duration *by this process's clock* since it
  first saw that record (no trust in other hosts' clocks);
* the holder renews every retry period; one that cannot for the renew deadline (shorter
  than the duration) steps down before anyone else may take over; one that finds another
  holder steps down at once;
* every write is a compare-and-swap on ``resourceVersion`` (a 409 loses the race);
* a replica stopping cleanly (SIGTERM) releases the lease first, so a standby takes over
  at its next retry instead of after the duration.

The Kubernetes client is imported only when the flag is on (it costs ~0.45 s of start-up).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import logging
import os
import random
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from epp.common import argtypes
from epp.discovery.poolref import resolve_namespace
from epp.errors import InternalError

if TYPE_CHECKING:
    from kubernetes_asyncio import client as k8s

log = logging.getLogger(__name__)

LEASE_API_VERSION = "coordination.k8s.io/v1"
MICRO_TIME = "%Y-%m-%dT%H:%M:%S.%fZ"  # a Lease's acquireTime / renewTime (RFC 3339, µs)


@dataclass(frozen=True)
class LeaseTiming:
    """How long a lease holds, how long its holder keeps trying to renew before it steps
    down, and how often every replica tries (the defaults are Kubernetes' own)."""

    duration_s: int = 15  # a Lease's leaseDurationSeconds is a whole number
    renew_deadline_s: float = 10.0
    retry_s: float = 2.0

    def check(self) -> None:
        """ValueError unless 0 < retry < renew deadline < duration."""
        if not 0 < self.retry_s < self.renew_deadline_s < self.duration_s:
            raise ValueError(
                "leader election needs 0 < --ha-retry-period-seconds "
                f"({self.retry_s:g}) < --ha-renew-deadline-seconds ({self.renew_deadline_s:g}) "
                f"< --ha-lease-duration-seconds ({self.duration_s})"
            )


@dataclass(frozen=True)
class LeaseRef:
    name: str
    namespace: str
    identity: str  # this replica's, unique among the contenders


@dataclass(frozen=True, slots=True)
class SeenLease:
    """A lease as read: who holds it, and what changes whenever it is renewed."""

    holder: str  # "" when released
    version: str  # metadata.resourceVersion: the next write must name it
    transitions: int
    acquire_time: str | None
    renew_time: str | None

    @property
    def record(self) -> tuple[str, str | None, int]:
        return (self.holder, self.renew_time, self.transitions)


class LeaseApi(Protocol):
    """The three calls leader election makes; False when the write lost a race (409)."""

    async def read(self, ref: LeaseRef) -> SeenLease | None: ...
    async def create(self, ref: LeaseRef, body: dict[str, Any]) -> bool: ...
    async def replace(self, ref: LeaseRef, body: dict[str, Any]) -> bool: ...


class LeaseError(InternalError):
    """The API server could not be asked or answered an error other than 404/409."""


class Outcome(Enum):
    HELD = "held"  # this replica holds the lease now
    OTHER = "other"  # another replica holds it, unexpired
    FAILED = "failed"  # unknown: the API failed or a write lost a race


def lease_body(
    ref: LeaseRef,
    holder: str,
    duration_s: int,
    *,
    acquire_time: str | None,
    renew_time: str,
    transitions: int,
    version: str | None,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": ref.name, "namespace": ref.namespace}
    if version is not None:
        metadata["resourceVersion"] = version
    spec: dict[str, Any] = {
        "holderIdentity": holder,
        "leaseDurationSeconds": duration_s,
        "renewTime": renew_time,
        "leaseTransitions": transitions,
    }
    if acquire_time is not None:
        spec["acquireTime"] = acquire_time
    return {"apiVersion": LEASE_API_VERSION, "kind": "Lease", "metadata": metadata, "spec": spec}


def micro_now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime(MICRO_TIME)


class LeaderElector:
    """Contends for ``ref`` through ``api`` while started; ``on_change(True)`` when this
    replica becomes the leader, ``on_change(False)`` when it stops being one."""

    def __init__(
        self,
        api: LeaseApi,
        ref: LeaseRef,
        timing: LeaseTiming,
        on_change: Callable[[bool], Awaitable[None]],
        *,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self._api = api
        self.ref = ref
        self.timing = timing
        self._on_change = on_change
        self._clock = clock
        self._rng = rng or random.Random()
        self.leader = False
        self._record: tuple[str, str | None, int] | None = None
        self._record_seen_at = 0.0
        self._renewed_at = 0.0
        self._task: asyncio.Task[None] | None = None

    async def attempt(self) -> Outcome:
        """One try to take or renew the lease."""
        now = self._clock()
        seen = await self._api.read(self.ref)
        if seen is None:
            body = self._body(None, acquire_time=micro_now(), transitions=0)
            return Outcome.HELD if await self._api.create(self.ref, body) else Outcome.FAILED
        if seen.record != self._record:
            self._record, self._record_seen_at = seen.record, now
        mine = seen.holder == self.ref.identity
        if seen.holder and not mine and now < self._record_seen_at + self.timing.duration_s:
            return Outcome.OTHER
        body = self._body(
            seen.version,
            acquire_time=seen.acquire_time if mine else micro_now(),
            transitions=seen.transitions if mine else seen.transitions + 1,
        )
        return Outcome.HELD if await self._api.replace(self.ref, body) else Outcome.FAILED

    def _body(self, version: str | None, *, acquire_time: str | None, transitions: int) -> Any:
        return lease_body(
            self.ref,
            self.ref.identity,
            self.timing.duration_s,
            acquire_time=acquire_time,
            renew_time=micro_now(),
            transitions=transitions,
            version=version,
        )

    async def step(self) -> None:
        """One attempt and what follows from it for leadership."""
        try:
            outcome = await self.attempt()
        except LeaseError as exc:
            log.warning("lease %s/%s: %s", self.ref.namespace, self.ref.name, exc)
            outcome = Outcome.FAILED
        now = self._clock()
        if outcome is Outcome.HELD:
            self._renewed_at = now
            await self._set(True)
        elif self.leader and (
            outcome is Outcome.OTHER or now - self._renewed_at >= self.timing.renew_deadline_s
        ):
            await self._set(False)

    async def _set(self, leader: bool) -> None:
        if leader == self.leader:
            return
        self.leader = leader
        log.info(
            "%s the leader (lease %s/%s, identity %s)",
            "became" if leader else "is no longer",
            self.ref.namespace,
            self.ref.name,
            self.ref.identity,
        )
        await self._on_change(leader)

    async def _run(self) -> None:
        while True:
            await self.step()
            jitter = 0.0 if self.leader else self._rng.uniform(0, 0.2)
            await asyncio.sleep(self.timing.retry_s * (1 + jitter))

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="leader-election")

    async def stop(self) -> None:
        """Stop contending; a leader releases the lease (a standby takes over at its
        next retry) and reports that it no longer leads."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.leader:
            try:
                await self.release()
            except LeaseError as exc:
                log.warning("lease %s/%s not released: %s", self.ref.namespace, self.ref.name, exc)
            await self._set(False)

    async def release(self) -> None:
        seen = await self._api.read(self.ref)
        if seen is None or seen.holder != self.ref.identity:
            return
        now = micro_now()
        body = lease_body(
            self.ref,
            "",
            1,
            acquire_time=now,
            renew_time=now,
            transitions=seen.transitions,
            version=seen.version,
        )
        await self._api.replace(self.ref, body)


class KubeLeases:
    """:class:`LeaseApi` over the Kubernetes API (``kubernetes-asyncio``)."""

    def __init__(self, api: k8s.ApiClient, timeout_s: float) -> None:
        from kubernetes_asyncio import client as k8s_client

        self._api = api
        self._leases = k8s_client.CoordinationV1Api(api)
        self._timeout_s = timeout_s

    async def read(self, ref: LeaseRef) -> SeenLease | None:
        lease = await self._call(
            self._leases.read_namespaced_lease(
                ref.name, ref.namespace, _request_timeout=self._timeout_s
            ),
            missing_ok=True,
        )
        if lease is None:
            return None
        spec = lease.spec
        return SeenLease(
            holder=(spec.holder_identity if spec else None) or "",
            version=str(lease.metadata.resource_version),
            transitions=(spec.lease_transitions if spec else None) or 0,
            acquire_time=_micro(spec.acquire_time if spec else None),
            renew_time=_micro(spec.renew_time if spec else None),
        )

    # A body goes as the dict it is: the client sends a dict unchanged, so the times keep
    # the MicroTime form we wrote (its V1Lease would write datetimes its own way).
    async def create(self, ref: LeaseRef, body: dict[str, Any]) -> bool:
        created = self._leases.create_namespaced_lease(
            ref.namespace,
            body,  # type: ignore[arg-type]
            _request_timeout=self._timeout_s,
        )
        return await self._call(created) is not None

    async def replace(self, ref: LeaseRef, body: dict[str, Any]) -> bool:
        replaced = self._leases.replace_namespaced_lease(
            ref.name,
            ref.namespace,
            body,  # type: ignore[arg-type]
            _request_timeout=self._timeout_s,
        )
        return await self._call(replaced) is not None

    async def _call(self, call: Awaitable[Any], *, missing_ok: bool = False) -> Any:
        """The call's answer; None on 409 (a lost race) and, if ``missing_ok``, 404;
        LeaseError on anything else that went wrong."""
        import aiohttp
        from kubernetes_asyncio.client.exceptions import ApiException

        try:
            return await call
        except ApiException as exc:
            if exc.status == 409 or (missing_ok and exc.status == 404):
                return None
            raise LeaseError(f"API server answered {exc.status} {exc.reason}") from None
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise LeaseError(f"API server unreachable: {exc!r}") from None

    async def close(self) -> None:
        await self._api.close()


def _micro(value: datetime.datetime | None) -> str | None:
    if value is None:
        return None
    return value.astimezone(datetime.UTC).strftime(MICRO_TIME)


# ---------------------------------------------------------------- `epp serve` wiring


@dataclass(frozen=True)
class LeaderOptions:
    """``--ha-enable-leader-election`` and its settings, as ``epp serve`` got them."""

    lease_name: str
    namespace: str | None  # None: the pool's, resolved as discovery resolves it
    kubeconfig: Path | None
    timing: LeaseTiming


def identity() -> str:
    """This replica's name among the contenders: the pod's name (``POD_NAME``, else the
    host name, which is the pod's in Kubernetes) and a random suffix, so that a restarted
    container never mistakes the old holder's lease for its own."""
    name = os.environ.get("POD_NAME") or socket.gethostname()
    return f"{name}_{uuid.uuid4().hex[:8]}"


class LeaderElection:
    """The :class:`LeaderElector` as a component of ``epp serve``: it holds readiness
    back (``readiness``) while this replica is not the leader."""

    def __init__(self, opts: LeaderOptions, readiness: Callable[[bool], Awaitable[None]]) -> None:
        self._opts = opts
        self._readiness = readiness
        self._elector: LeaderElector | None = None
        self._leases: KubeLeases | None = None

    async def start(self) -> None:
        """Connect (OSError if the client config cannot be read) and start contending."""
        from epp.discovery.kubernetes import api_client

        o = self._opts
        api = await api_client(o.kubeconfig)
        self._leases = KubeLeases(api, timeout_s=o.timing.retry_s)
        namespace = resolve_namespace(o.namespace, o.kubeconfig)
        ref = LeaseRef(o.lease_name, namespace, identity())
        log.info(
            "leader election: lease %s/%s as %s; ready only while leading",
            ref.namespace,
            ref.name,
            ref.identity,
        )
        self._elector = LeaderElector(self._leases, ref, o.timing, self._readiness)
        self._elector.start()

    async def stop(self) -> None:
        if self._elector is not None:
            await self._elector.stop()
        if self._leases is not None:
            await self._leases.close()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group(
        "leader election", "with --ha-enable-leader-election (docs/replicas.md)"
    )
    g.add_argument(
        "--ha-lease-name",
        metavar="NAME",
        help="the coordination.k8s.io/v1 Lease the replicas contend for, in the pool's "
        "namespace (default: POOL-epp-leader, or epp-leader with --endpoint-selector)",
    )
    timing = LeaseTiming()
    for flag, kind, default, what in (
        ("--ha-lease-duration-seconds", argtypes.positive_int, timing.duration_s,
         "how long a lease holds without renewal: a dead leader's standby takes over "
         "within it"),
        ("--ha-renew-deadline-seconds", argtypes.positive_float, timing.renew_deadline_s,
         "a leader that cannot renew for this long steps down (not ready)"),
        ("--ha-retry-period-seconds", argtypes.positive_float, timing.retry_s,
         "how often each replica tries to take or renew the lease"),
    ):  # fmt: skip
        g.add_argument(flag, type=kind, default=default, metavar="SECONDS", help=what)


def options(args: argparse.Namespace) -> LeaderOptions | None:
    """The leader election the flags ask for, if any; ValueError if they cannot work."""
    if not args.ha_enable_leader_election:
        return None
    timing = LeaseTiming(
        args.ha_lease_duration_seconds,
        args.ha_renew_deadline_seconds,
        args.ha_retry_period_seconds,
    )
    timing.check()
    if args.pool_name is None and args.endpoint_selector is None:
        raise ValueError(
            "--ha-enable-leader-election needs --pool-name or --endpoint-selector: the "
            "lease lives in the pool's namespace, through the same Kubernetes client"
        )
    name = args.ha_lease_name or (
        f"{args.pool_name}-epp-leader" if args.pool_name else "epp-leader"
    )
    return LeaderOptions(name, args.pool_namespace, args.kubeconfig, timing)
