"""The endpoint registry: membership, each member's lifecycle, and in-flight counts.

Lifecycle of a member (``Status``)::

    waiting ──▶ healthy ◀──▶ ejected
                  │            │
                  └──▶ draining ◀┘ ──▶ gone

* ``waiting``: announced (admin API) but not answering yet; never picked.
* ``healthy`` (ACTIVE): the only status the scheduler sees (``Snapshot.endpoints``).
* ``ejected``: failing; out of picking until its health module reinstates it.
* ``draining``: removed while requests were in flight: no new picks; it goes when its
  last request ends or its drain deadline passes (:meth:`Datastore.expire_drains`).

Every source (static flags, Kubernetes discovery, the admin API) calls :meth:`add` and
:meth:`remove`; ``remove`` drains, so no source can cut requests short. One address is
one member whoever added it: the last ``add`` decides its role and labels, and a
``remove`` from any source removes it (documented in docs/architecture.md).

In-flight counts come in two tables: this process's OWN (what it routed and has not
seen end: :meth:`acquire` and tickets, drains, ``epp_in_flight_requests``, /status) and
own plus what its peers report they have in flight (replicas and workers sharing their
load, :mod:`epp.datalayer.peers`), which snapshots hand the scheduler. Without peers the
two are equal.

Writers call these methods on the event loop; the scheduler only reads snapshots.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from types import MappingProxyType

from epp.types import Endpoint, EndpointMetrics, EndpointState, Snapshot

log = logging.getLogger(__name__)

DEFAULT_DRAIN_TIMEOUT_S = 600.0
# The address of a claim whose endpoint is not chosen yet (deferred decode selection: the
# request's prefill leg runs first): counted in :attr:`Datastore.pending`, on no endpoint
PENDING = ""


class Status(StrEnum):
    WAITING = "waiting"
    ACTIVE = "healthy"
    EJECTED = "ejected"
    DRAINING = "draining"


@dataclass(frozen=True, slots=True)
class Member:
    """One address the datastore knows, whatever its status (a copy: read-only)."""

    state: EndpointState
    status: Status
    since: float  # monotonic time of the last status change
    until: float = 0.0  # draining: the deadline; 0 otherwise

    @property
    def endpoint(self) -> Endpoint:
        return self.state.endpoint

    @property
    def address(self) -> str:
        return self.state.address


class InFlightTicket:
    """One routed request's claim on an endpoint; releasing twice is a no-op, so every
    exit path (end of stream, cancel, error) may call :meth:`release`."""

    __slots__ = ("_datastore", "address", "epoch", "released", "tokens")

    def __init__(self, datastore: Datastore, address: str, tokens: int, epoch: int) -> None:
        self._datastore = datastore
        self.address = address
        self.tokens = tokens
        self.epoch = epoch  # which life of the address's counters it counts in
        self.released = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self._datastore._release(self.address, self.tokens, self.epoch)


class Datastore:
    def __init__(
        self,
        *,
        drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.drain_timeout_s = drain_timeout_s
        self._clock = clock
        self._members: dict[str, Member] = {}
        # the active members' states: what snapshots hold (kept in step with _members)
        self._states: dict[str, EndpointState] = {}
        self._states_view = MappingProxyType(self._states)
        self._in_flight: dict[str, int] = {}
        self._in_flight_view = MappingProxyType(self._in_flight)
        self._in_flight_tokens: dict[str, int] = {}
        self._in_flight_tokens_view = MappingProxyType(self._in_flight_tokens)
        # what peers have in flight (summed over them), and own + peers: what snapshots
        # show (an entry for every address either table has)
        self._peer_in_flight: dict[str, int] = {}
        self._peer_in_flight_view = MappingProxyType(self._peer_in_flight)
        self._peer_tokens: dict[str, int] = {}
        self._load: dict[str, int] = {}
        self._load_view = MappingProxyType(self._load)
        self._load_tokens: dict[str, int] = {}
        self._load_tokens_view = MappingProxyType(self._load_tokens)
        # bumped when an address's counters are dropped with requests still open, so
        # their late releases are ignored
        self._epochs: dict[str, int] = {}
        self._version = 0
        self._snapshot: Snapshot | None = None
        self._listeners: list[Callable[[], None]] = []
        self._metrics_listeners: list[Callable[[str, EndpointMetrics], None]] = []
        self._on_release: Callable[[], None] | None = None
        self._on_own_change: Callable[[], None] | None = None
        self._load_listeners: list[Callable[[str], None]] = []
        self._pending = 0

    # -- membership ---------------------------------------------------------------
    def add(self, endpoint: Endpoint, *, waiting: bool = False) -> bool:
        """Add (``waiting``: announce) an endpoint, or update a member's role/labels.

        A draining member is taken back (someone wants it again: active, or waiting when
        ``waiting`` since its server is not up); an ejected one stays ejected (a discovery
        resync must not undo a health decision); a waiting one becomes active unless
        ``waiting``. Returns False if nothing changed.
        """
        current = self._members.get(endpoint.address)
        metrics = current.state.metrics if current is not None else None
        if current is not None and current.status is Status.EJECTED:
            status = Status.EJECTED
        elif current is not None and current.status is Status.ACTIVE:
            status = Status.ACTIVE
        else:  # new, waiting or draining
            status = Status.WAITING if waiting else Status.ACTIVE
        if current is not None and current.endpoint == endpoint and current.status is status:
            return False
        # a changed endpoint (e.g. new role) keeps the load it last reported
        self._set(EndpointState(endpoint, metrics), status)
        self._in_flight.setdefault(endpoint.address, 0)
        self._in_flight_tokens.setdefault(endpoint.address, 0)
        self._sync(endpoint.address)
        self._changed()
        log.info(
            "endpoint %s %s (role=%s)",
            endpoint.address,
            "is waiting to start" if status is Status.WAITING else f"is {status.value}",
            endpoint.role.value,
        )
        return True

    def remove(self, address: str) -> bool:
        """Take ``address`` out of picking at once; it goes when its in-flight requests
        end (or its drain deadline passes). False if it was not a member."""
        member = self._members.get(address)
        if member is None:
            return False
        if self._in_flight.get(address, 0) > 0 and member.status is not Status.WAITING:
            if member.status is not Status.DRAINING:
                until = self._clock() + self.drain_timeout_s
                self._set(member.state, Status.DRAINING, until=until)
                self._changed()
                log.info(
                    "endpoint %s draining: %d request(s) in flight (deadline %gs)",
                    address,
                    self._in_flight[address],
                    self.drain_timeout_s,
                )
            return True
        self._drop(address, "removed")
        return True

    def eject(self, address: str) -> bool:
        """Take a healthy member out of picking (it stays known, for reinstatement)."""
        return self._move(address, Status.ACTIVE, Status.EJECTED)

    def reinstate(self, address: str) -> bool:
        """Put an ejected member back into picking."""
        return self._move(address, Status.EJECTED, Status.ACTIVE)

    def expire_drains(self) -> list[str]:
        """Drop draining members whose deadline has passed (their remaining requests
        are no longer waited for); returns their addresses."""
        now = self._clock()
        expired = [
            m.address
            for m in self._members.values()
            if m.status is Status.DRAINING and m.until <= now
        ]
        for address in expired:
            self._drop(address, "drain deadline passed with requests still in flight; removed")
        return expired

    def update_metrics(self, address: str, metrics: EndpointMetrics) -> bool:
        """Replace a member's reported load; False if the endpoint is not (any longer)
        a member, so late scrapes of removed endpoints are dropped."""
        member = self._members.get(address)
        if member is None:
            return False
        state = replace(member.state, metrics=metrics)
        self._members[address] = replace(member, state=state)
        if address in self._states:
            self._states[address] = state
            self._snapshot = None  # membership unchanged: no version bump, no listeners
        for listener in self._metrics_listeners:
            listener(address, metrics)
        return True

    def get(self, address: str) -> EndpointState | None:
        """A member's state, whatever its status."""
        member = self._members.get(address)
        return member.state if member is not None else None

    def member(self, address: str) -> Member | None:
        return self._members.get(address)

    def members(self) -> list[Member]:
        """Every member, whatever its status, in the order they joined."""
        return list(self._members.values())

    def __len__(self) -> int:
        return len(self._members)

    def on_change(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` after every membership or status change."""
        self._listeners.append(listener)

    def on_metrics(self, listener: Callable[[str, EndpointMetrics], None]) -> None:
        """Call ``listener(address, metrics)`` after every accepted load report (the
        parent of ``--workers`` passes them on)."""
        self._metrics_listeners.append(listener)

    def on_release(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` after every in-flight release (flow control: room may have
        freed); one listener, the last set."""
        self._on_release = listener

    def on_load(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(address)`` after every change of the requests snapshots count
        in flight on ``address`` (own and peers'; admission keeps which endpoints lack
        room by it)."""
        self._load_listeners.append(listener)

    def on_own_change(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` after every change of this process's own in-flight counts
        (peer load publishes them); one listener, the last set."""
        self._on_own_change = listener

    # -- load accounting ------------------------------------------------------------
    def acquire(self, address: str, tokens: int = 0) -> InFlightTicket:
        """Count one request (estimated at ``tokens`` prompt + output tokens) as in
        flight on ``address`` until the ticket is released."""
        self._in_flight[address] = self._in_flight.get(address, 0) + 1
        self._in_flight_tokens[address] = self._in_flight_tokens.get(address, 0) + tokens
        self._load[address] = self._load.get(address, 0) + 1  # own + peers, one more
        self._load_tokens[address] = self._load_tokens.get(address, 0) + tokens
        for listener in self._load_listeners:
            listener(address)
        if self._on_own_change is not None:
            self._on_own_change()
        return InFlightTicket(self, address, tokens, self._epochs.get(address, 0))

    def acquire_pending(self, tokens: int = 0) -> InFlightTicket:
        """Count a request whose endpoint is chosen later (its decode endpoint, after
        its prefill leg) until the ticket is released; the router then trades it for a
        claim on the chosen endpoint (``tokens`` go with it)."""
        self._pending += 1
        return InFlightTicket(self, PENDING, tokens, 0)

    @property
    def pending(self) -> int:
        """Requests in flight whose endpoint is not chosen yet."""
        return self._pending

    def _release(self, address: str, tokens: int, epoch: int) -> None:
        if address == PENDING:
            self._pending = max(self._pending - 1, 0)
            return
        if epoch != self._epochs.get(address, 0):
            # counted before a drain deadline dropped the address: its counters are
            # gone, and a member re-added since must not lose one of its own
            return
        count = max(self._in_flight.get(address, 0) - 1, 0)
        member = self._members.get(address)
        if member is None and count == 0:  # a dropped member's last request
            self._in_flight.pop(address, None)
            self._in_flight_tokens.pop(address, None)
            self._sync(address)
            if self._on_own_change is not None:
                self._on_own_change()
            return
        self._in_flight[address] = count
        self._in_flight_tokens[address] = max(self._in_flight_tokens.get(address, 0) - tokens, 0)
        self._sync(address)
        if self._on_own_change is not None:
            self._on_own_change()
        if count == 0 and member is not None and member.status is Status.DRAINING:
            self._drop(address, "drained; removed")
        if self._on_release is not None:
            self._on_release()

    def in_flight(self, address: str) -> int:
        """This process's own requests in flight on ``address``."""
        return self._in_flight.get(address, 0)

    def total_in_flight(self) -> int:
        """This process's own requests in flight, over every endpoint."""
        return sum(self._in_flight.values())

    @property
    def own_in_flight(self) -> Mapping[str, int]:
        """Address -> this process's own requests in flight (a live read-only view)."""
        return self._in_flight_view

    @property
    def own_in_flight_tokens(self) -> Mapping[str, int]:
        """Address -> the estimated tokens of this process's own requests in flight."""
        return self._in_flight_tokens_view

    # -- what peers have in flight -----------------------------------------------------
    def set_peer_load(self, loads: Mapping[str, tuple[int, int]]) -> None:
        """Set what peers have in flight on each address named (requests, tokens:
        summed over every peer; (0, 0): none). Snapshots show it added to this
        process's own counts; a decrease may free room (the release listener hears it)."""
        freed = False
        for address, (requests, tokens) in loads.items():
            freed = freed or requests < self._peer_in_flight.get(address, 0)
            for table, n in ((self._peer_in_flight, requests), (self._peer_tokens, tokens)):
                if n > 0:
                    table[address] = n
                else:
                    table.pop(address, None)
            self._sync(address)
        if freed and self._on_release is not None:
            self._on_release()

    @property
    def peer_in_flight_table(self) -> Mapping[str, int]:
        """Address -> requests peers report in flight there (non-zero entries; live)."""
        return self._peer_in_flight_view

    # -- the scheduler's view ---------------------------------------------------------
    def snapshot(self) -> Snapshot:
        """The active members (cached until membership or status changes)."""
        if self._snapshot is None:
            self._snapshot = Snapshot(
                endpoints=tuple(self._states.values()),
                in_flight=self._load_view,
                in_flight_tokens=self._load_tokens_view,
                version=self._version,
                by_address=self._states_view,
            )
        return self._snapshot

    @property
    def version(self) -> int:
        """Bumped on every membership or status change."""
        return self._version

    # -- internals ----------------------------------------------------------------------
    def _set(self, state: EndpointState, status: Status, until: float = 0.0) -> None:
        address = state.address
        current = self._members.get(address)
        since = current.since if current is not None and current.status is status else None
        self._members[address] = Member(
            state, status, since if since is not None else self._clock(), until
        )
        if status is Status.ACTIVE:
            self._states[address] = state
        else:
            self._states.pop(address, None)

    def _move(self, address: str, current: Status, to: Status) -> bool:
        member = self._members.get(address)
        if member is None or member.status is not current:
            return False
        self._set(member.state, to)
        self._changed()
        return True

    def _drop(self, address: str, why: str) -> None:
        self._members.pop(address, None)
        self._states.pop(address, None)
        if self._in_flight.pop(address, 0):  # requests still open (drain deadline passed)
            self._epochs[address] = self._epochs.get(address, 0) + 1
            if self._on_own_change is not None:
                self._on_own_change()
        self._in_flight_tokens.pop(address, None)
        self._sync(address)
        self._changed()
        log.info("endpoint %s %s", address, why)

    def _sync(self, address: str) -> None:
        """Own + peers for ``address`` into the tables snapshots show (an address that
        neither counts leaves them; a member's stays, at 0)."""
        for own, peer, load in (
            (self._in_flight, self._peer_in_flight, self._load),
            (self._in_flight_tokens, self._peer_tokens, self._load_tokens),
        ):
            mine = own.get(address)
            theirs = peer.get(address, 0)
            if mine is None and not theirs:
                load.pop(address, None)
            else:
                load[address] = (mine or 0) + theirs
        for listener in self._load_listeners:
            listener(address)

    def _changed(self) -> None:
        self._version += 1
        self._snapshot = None
        for listener in self._listeners:
            listener()
