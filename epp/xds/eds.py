"""EDS: the model-server cluster's endpoints, served to Envoy from the datastore.

``envoy.service.endpoint.v3.EndpointDiscoveryService/StreamEndpoints``, state of the
world: every change of membership or status (add, remove, drain, eject, reinstate)
pushes the whole ``ClusterLoadAssignment`` again, versioned by the datastore's version.
Healthy members are ``HEALTHY``, ejected ones ``UNHEALTHY`` (Envoy's fallback policy
skips them), draining ones ``DRAINING`` (no new requests, open ones finish); waiting
members are not listed, as Envoy must not route to them.

Envoy rejects a whole update if one endpoint's address is not an IP literal (e.g. a host
name) or cannot be connected to, so every member is checked before it is sent
(:func:`eds_problem`): one bad member is left out and reported, never the pool.

An EPP that starts behind a running Envoy (a restart) may be asked to route before
Envoy's EDS stream has reconnected: Envoy still holds the old process's endpoints then,
and a pick it does not know would fall back to one of those. :class:`EnvoySync` tells
the ext_proc streams when an Envoy has acknowledged this process's endpoints, so they
can hold their answer until then (``epp.extproc.stream``).

Transport-agnostic: both gRPC transports feed :meth:`EdsServer.stream` the requests
of one call and send what it yields.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from collections.abc import AsyncIterator, Iterable

from envoy.config.core.v3.address_pb2 import Address, SocketAddress
from envoy.config.core.v3.health_check_pb2 import HealthStatus
from envoy.config.endpoint.v3.endpoint_components_pb2 import (
    Endpoint,
    LbEndpoint,
    LocalityLbEndpoints,
)
from envoy.config.endpoint.v3.endpoint_pb2 import ClusterLoadAssignment
from envoy.service.discovery.v3.discovery_pb2 import DiscoveryRequest, DiscoveryResponse

from epp.datastore import Datastore, Member, Status

log = logging.getLogger(__name__)

EDS_SERVICE = "envoy.service.endpoint.v3.EndpointDiscoveryService"
EDS_TYPE_URL = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
MODEL_CLUSTER = "model_servers"

_HEALTH = {
    Status.ACTIVE: HealthStatus.HEALTHY,
    Status.EJECTED: HealthStatus.UNHEALTHY,
    Status.DRAINING: HealthStatus.DRAINING,
}


def eds_problem(host: str, port: int) -> str | None:
    """Why Envoy would reject this endpoint, or None if it would take it (pure)."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return f"{host!r} is not an IP address (Envoy's EDS takes no host names)"
    if ip.is_unspecified:
        return f"{host} is the unspecified address, not one to connect to"
    if not 0 < port < 65536:
        return f"port {port} is outside 1-65535"
    return None


def load_assignment(
    cluster: str, members: Iterable[Member], left_out: dict[str, str] | None = None
) -> ClusterLoadAssignment:
    """The cluster's endpoints as Envoy should know them (pure); members Envoy would
    reject are not listed, and go into ``left_out`` (address -> why)."""
    listed = []
    for m in members:
        problem = eds_problem(m.endpoint.host, m.endpoint.port)
        if problem is None:
            listed.append(m)
        elif left_out is not None:
            left_out[m.address] = problem
    lb_endpoints = [
        LbEndpoint(
            endpoint=Endpoint(
                address=Address(
                    socket_address=SocketAddress(
                        address=m.endpoint.host, port_value=m.endpoint.port
                    )
                )
            ),
            health_status=_HEALTH[m.status],
        )
        for m in listed
        if m.status in _HEALTH
    ]
    return ClusterLoadAssignment(
        cluster_name=cluster, endpoints=[LocalityLbEndpoints(lb_endpoints=lb_endpoints)]
    )


# The longest an ext_proc answer waits for Envoy's first EDS acknowledgement; past it
# (no Envoy takes EDS from us, or a broken EDS config) nothing waits any more.
EDS_SYNC_WAIT_S = 5.0


class EnvoySync:
    """Whether an Envoy has acknowledged an EDS assignment of this process yet."""

    def __init__(self, wait_s: float = EDS_SYNC_WAIT_S) -> None:
        self._acked = asyncio.Event()
        self._wait_s = wait_s
        self._gave_up = False

    @property
    def synced(self) -> bool:
        """True once acknowledged, or once waiting for it timed out."""
        return self._acked.is_set() or self._gave_up

    def acknowledged(self) -> None:
        self._acked.set()

    async def wait(self) -> None:
        """Until an Envoy acknowledges our endpoints, at most ``wait_s`` (then never
        again: a missing EDS stream must not slow every request)."""
        if self.synced:
            return
        try:
            await asyncio.wait_for(self._acked.wait(), self._wait_s)
        except TimeoutError:
            if not self._gave_up:
                log.warning(
                    "no Envoy acknowledged the EDS endpoints within %gs; routing without "
                    "waiting for it (an Envoy that still has an earlier endpoint list may "
                    "fall back to one of those)",
                    self._wait_s,
                )
            self._gave_up = True


class EdsServer:
    def __init__(
        self, datastore: Datastore, cluster: str = MODEL_CLUSTER, sync: EnvoySync | None = None
    ) -> None:
        self._datastore = datastore
        self.sync = sync or EnvoySync()
        self.cluster = cluster
        self._wakes: set[asyncio.Event] = set()
        self._closed = False
        self._reported: set[str] = set()  # members left out of the last assignment
        datastore.on_change(self._wake_all)

    def close(self) -> None:
        """End every open stream (and refuse new ones): for a quick shutdown, as Envoy
        keeps the last endpoints it was told."""
        self._closed = True
        self._wake_all()

    async def stream(
        self, requests: AsyncIterator[DiscoveryRequest]
    ) -> AsyncIterator[DiscoveryResponse]:
        wake = asyncio.Event()
        subscribed = asyncio.Event()
        ended = False
        nonce = 0

        async def read() -> None:
            nonlocal ended
            try:
                async for request in requests:
                    if request.type_url and request.type_url != EDS_TYPE_URL:
                        log.warning("EDS: ignoring a request for type %s", request.type_url)
                        continue
                    if request.HasField("error_detail"):
                        log.error(
                            "Envoy rejected EDS version %s: %s",
                            request.version_info,
                            request.error_detail.message,
                        )
                    elif nonce and request.response_nonce == str(nonce):
                        self.sync.acknowledged()  # Envoy applied what we sent last
                    names = set(request.resource_names)
                    if not names or self.cluster in names:
                        subscribed.set()
                    wake.set()
            finally:
                ended = True
                wake.set()

        reader = asyncio.get_running_loop().create_task(read(), name="eds-read")
        self._wakes.add(wake)
        sent: int | None = None
        try:
            while True:
                await wake.wait()
                wake.clear()
                if ended or self._closed:
                    return
                version = self._datastore.version
                if not subscribed.is_set() or version == sent:
                    continue
                nonce += 1
                left_out: dict[str, str] = {}
                assignment = load_assignment(self.cluster, self._datastore.members(), left_out)
                self._report(left_out)
                response = DiscoveryResponse(
                    version_info=str(version), type_url=EDS_TYPE_URL, nonce=str(nonce)
                )
                response.resources.add().Pack(assignment)
                sent = version
                yield response
        finally:
            self._wakes.discard(wake)
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)

    def _report(self, left_out: dict[str, str]) -> None:
        """Log each member left out of the assignment once (until it is fixed)."""
        for address, why in left_out.items():
            if address not in self._reported:
                log.error("EDS: not sending %s to Envoy: %s; left out", address, why)
        self._reported = set(left_out)

    def _wake_all(self) -> None:
        for wake in self._wakes:
            wake.set()
