"""The endpoint registry: membership, per-endpoint state and the EPP's in-flight counts.

Writers (discovery, admin API, the Envoy adapter) call its methods on the event loop;
the scheduler only ever sees :class:`Snapshot`s.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from types import MappingProxyType

from epp.types import Endpoint, EndpointMetrics, EndpointState, Snapshot

log = logging.getLogger(__name__)


class InFlightTicket:
    """One routed request's claim on an endpoint; releasing twice is a no-op, so every
    exit path (end of stream, cancel, error) may call :meth:`release`."""

    __slots__ = ("_datastore", "address", "released", "tokens")

    def __init__(self, datastore: Datastore, address: str, tokens: int) -> None:
        self._datastore = datastore
        self.address = address
        self.tokens = tokens
        self.released = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self._datastore._release(self.address, self.tokens)


class Datastore:
    def __init__(self) -> None:
        self._states: dict[str, EndpointState] = {}
        self._states_view = MappingProxyType(self._states)
        self._in_flight: dict[str, int] = {}
        self._in_flight_view = MappingProxyType(self._in_flight)
        self._in_flight_tokens: dict[str, int] = {}
        self._in_flight_tokens_view = MappingProxyType(self._in_flight_tokens)
        self._version = 0
        self._snapshot: Snapshot | None = None
        self._listeners: list[Callable[[], None]] = []

    # -- membership ---------------------------------------------------------------
    def add(self, endpoint: Endpoint) -> bool:
        """Add or replace an endpoint; returns False if it was already present unchanged."""
        current = self._states.get(endpoint.address)
        if current is not None and current.endpoint == endpoint:
            return False
        # a changed endpoint (e.g. new role) keeps the load it last reported
        self._states[endpoint.address] = EndpointState(
            endpoint, current.metrics if current is not None else None
        )
        self._in_flight.setdefault(endpoint.address, 0)
        self._in_flight_tokens.setdefault(endpoint.address, 0)
        self._changed()
        log.info("endpoint %s added (role=%s)", endpoint.address, endpoint.role.value)
        return True

    def remove(self, address: str) -> bool:
        if self._states.pop(address, None) is None:
            return False
        if self._in_flight.get(address, 0) == 0:
            self._in_flight.pop(address, None)
            self._in_flight_tokens.pop(address, None)
        self._changed()
        log.info("endpoint %s removed", address)
        return True

    def update_metrics(self, address: str, metrics: EndpointMetrics) -> bool:
        """Replace an endpoint's reported load; False if the endpoint is not (any longer)
        in the pool, so late scrapes of removed endpoints are dropped."""
        state = self._states.get(address)
        if state is None:
            return False
        self._states[address] = replace(state, metrics=metrics)
        self._snapshot = None  # membership unchanged: no version bump, no listeners
        return True

    def get(self, address: str) -> EndpointState | None:
        return self._states.get(address)

    def __len__(self) -> int:
        return len(self._states)

    def on_change(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` after every membership or state change."""
        self._listeners.append(listener)

    # -- load accounting ------------------------------------------------------------
    def acquire(self, address: str, tokens: int = 0) -> InFlightTicket:
        """Count one request (estimated at ``tokens`` prompt + output tokens) as in
        flight on ``address`` until the ticket is released."""
        self._in_flight[address] = self._in_flight.get(address, 0) + 1
        self._in_flight_tokens[address] = self._in_flight_tokens.get(address, 0) + tokens
        return InFlightTicket(self, address, tokens)

    def _release(self, address: str, tokens: int) -> None:
        count = self._in_flight.get(address, 0) - 1
        if count > 0 or address in self._states:
            self._in_flight[address] = max(count, 0)
            self._in_flight_tokens[address] = max(
                self._in_flight_tokens.get(address, 0) - tokens, 0
            )
        else:
            # a removed endpoint's counters go once its last request is done
            self._in_flight.pop(address, None)
            self._in_flight_tokens.pop(address, None)

    def in_flight(self, address: str) -> int:
        return self._in_flight.get(address, 0)

    def total_in_flight(self) -> int:
        return sum(self._in_flight.values())

    # -- the scheduler's view ---------------------------------------------------------
    def snapshot(self) -> Snapshot:
        if self._snapshot is None:
            self._snapshot = Snapshot(
                endpoints=tuple(self._states.values()),
                in_flight=self._in_flight_view,
                in_flight_tokens=self._in_flight_tokens_view,
                version=self._version,
                by_address=self._states_view,
            )
        return self._snapshot

    def _changed(self) -> None:
        self._version += 1
        self._snapshot = None
        for listener in self._listeners:
            listener()
