"""Host names to addresses: the one place the EPP looks names up.

Envoy's EDS only takes IP addresses, and one server must be one member, so a server
given as ``name:port`` (flags, config, admin API, state file) joins the pool under the
one address its name resolves to (:func:`epp.common.addresses.pick`: IPv4 first). Every
``interval_s`` each followed name is looked up again; when its address changed, the new
address joins with the same role, labels and engine and the old one is removed, which
drains it (requests in flight finish). A name that does not resolve keeps its last
address (a DNS hiccup must not empty the pool) and is looked up again next round; a
static name that has never resolved joins when it first does.

A name is followed while its address is a member: when the member leaves (removed
through the admin API, or by failure ejection) the name is forgotten too.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

from epp.common import addresses, looptask
from epp.datastore import Datastore, Status
from epp.errors import InternalError
from epp.types import Endpoint

log = logging.getLogger(__name__)

# (host, port) -> (family, ip) results in the resolver's order
Lookup = Callable[[str, int], Awaitable[list[tuple[int, str]]]]
# told (old address, the endpoint that replaces it) before the datastore changes
MoveListener = Callable[[str, Endpoint], None]

DEFAULT_RESOLVE_INTERVAL_S = 30.0


class ResolveError(InternalError, ValueError):
    """A name that gave no usable address; the message names it and why."""


async def system_lookup(host: str, port: int) -> list[tuple[int, str]]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [(int(family), str(sockaddr[0])) for family, _, _, _, sockaddr in infos]


@dataclass(slots=True)
class _Followed:
    named: Endpoint  # host = the name
    current: Endpoint | None  # what it resolved to last; None: never resolved yet


class NameResolver:
    def __init__(
        self,
        datastore: Datastore,
        *,
        interval_s: float = DEFAULT_RESOLVE_INTERVAL_S,
        lookup: Lookup = system_lookup,
    ) -> None:
        self._datastore = datastore
        self.interval_s = interval_s
        self._lookup = lookup
        self._followed: dict[str, _Followed] = {}  # by name:port
        self._listeners: list[MoveListener] = []
        self._loop = looptask.every("re-resolving host names", interval_s, self.refresh, log)
        datastore.on_change(self._forget_gone)

    def on_move(self, listener: MoveListener) -> None:
        self._listeners.append(listener)

    async def resolve(self, endpoint: Endpoint) -> Endpoint:
        """``endpoint`` with its host resolved to one address and ``name`` set; an
        endpoint whose host is an IP is returned unchanged. Raises ResolveError."""
        if addresses.is_ip(endpoint.host):
            return endpoint
        name = addresses.join(endpoint.host, endpoint.port)
        try:
            results = await self._lookup(endpoint.host, endpoint.port)
        except (OSError, UnicodeError) as exc:  # socket.gaierror is an OSError
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise ResolveError(f"cannot resolve {name!r}: {reason}") from None
        ip = addresses.pick(results)
        if ip is None:
            raise ResolveError(f"cannot resolve {name!r}: no usable address")
        return replace(endpoint, host=ip, name=name)

    def address_of(self, name: str) -> str | None:
        """The address a followed ``name:port`` stands for now, if any."""
        followed = self._followed.get(name)
        return followed.current.address if followed and followed.current else None

    async def add_static(self, endpoint: Endpoint) -> None:
        """Add a flag or config endpoint; a name that does not resolve yet is logged
        and tried again every round until it does."""
        try:
            resolved = await self.resolve(endpoint)
        except ResolveError as exc:
            log.warning("%s; it joins when it resolves (looked up every %gs)", exc, self.interval_s)
            self._followed[addresses.join(endpoint.host, endpoint.port)] = _Followed(endpoint, None)
            return
        self._datastore.add(resolved)
        self.follow(resolved)

    def follow(self, resolved: Endpoint) -> None:
        """Look ``resolved.name`` up again every round (no-op for IP endpoints)."""
        if resolved.name:
            host, _ = addresses.parse_address(resolved.name)
            self._followed[resolved.name] = _Followed(replace(resolved, host=host), resolved)

    # -- the loop ---------------------------------------------------------------------
    def start(self) -> None:
        if self.interval_s > 0:
            self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()

    async def refresh(self) -> None:
        """Look every followed name up once and apply what changed."""
        for name, followed in list(self._followed.items()):
            try:
                resolved = await self.resolve(followed.named)
            except ResolveError as exc:
                if followed.current is None:
                    log.debug("%s", exc)
                else:
                    log.warning("%s; keeping %s", exc, followed.current.address)
                continue
            if self._followed.get(name) is not followed:
                continue  # forgotten or replaced while we looked it up
            old = followed.current
            if old is not None and old.address == resolved.address:
                continue
            if old is not None:
                member = self._datastore.member(old.address)
                if member is None or member.status in (Status.WAITING, Status.DRAINING):
                    continue  # gone or removed; or its readiness wait runs on the old one
                # keep what the pool learnt about it since (role changed by an add)
                resolved = replace(member.endpoint, host=resolved.host, name=name)
            followed.current = resolved
            for listener in self._listeners:
                listener(old.address if old is not None else "", resolved)
            self._datastore.add(resolved)
            if old is None:
                log.info("%s resolves to %s; added", name, resolved.address)
            else:
                log.warning(
                    "%s now resolves to %s (was %s); draining the old address",
                    name,
                    resolved.address,
                    old.address,
                )
                self._datastore.remove(old.address)

    def _forget_gone(self) -> None:
        for name, followed in list(self._followed.items()):
            current = followed.current
            if current is not None and self._datastore.member(current.address) is None:
                del self._followed[name]
