"""Which model server holds which LoRA adapter: bookkeeping without I/O.

What the EPP knows comes from the servers themselves: ``GET /v1/models`` lists each
adapter a vLLM server has loaded (``--lora-modules`` at start or loaded at runtime) as a
card whose ``parent`` is the base model (:func:`listed_adapters`). The EPP's own loads
and unloads keep it current between two listings, and so does an answer that says a
server lacks an adapter (:func:`doubted`): the adapter is dropped there until the server
lists it again.

Read on the request path: :meth:`Holdings.lists` (one dict lookup: does any server list
this model as an adapter?) for every request, :meth:`Holdings.holders` (one pass over
the pool) and :func:`with_holders` (its fallback list) only for a request that names an
adapter.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Any

from epp.types import Endpoint, EndpointMetrics, EndpointState, Role


class Holdings:
    """address -> the adapters it holds (least recently routed to first), and the
    reverse index adapter -> addresses."""

    def __init__(self) -> None:
        self._held: dict[str, OrderedDict[str, None]] = {}
        self._where: dict[str, set[str]] = {}

    # -- what the servers said, and what the EPP did ----------------------------------

    def listed(self, address: str, adapters: Iterable[str]) -> None:
        """``address`` listed exactly ``adapters``: those it no longer lists are gone
        there; new ones come after the others, whose routing order is kept."""
        now = dict.fromkeys(adapters)
        held = self._held.setdefault(address, OrderedDict())
        for gone in [a for a in held if a not in now]:
            self.remove(address, gone)
        for adapter in now:
            self.add(address, adapter)

    def add(self, address: str, adapter: str) -> None:
        """``address`` holds ``adapter`` (listed, or loaded there by the EPP)."""
        held = self._held.setdefault(address, OrderedDict())
        if adapter not in held:
            held[adapter] = None
            self._where.setdefault(adapter, set()).add(address)

    def remove(self, address: str, adapter: str) -> bool:
        """``address`` no longer holds ``adapter``; whether the EPP thought it did."""
        held = self._held.get(address)
        if held is None or adapter not in held:
            return False
        del held[adapter]
        where = self._where[adapter]
        where.discard(address)
        if not where:
            del self._where[adapter]
        return True

    def forget(self, address: str) -> None:
        """``address`` left the pool: nothing is known of it any more."""
        for adapter in list(self._held.get(address, ())):
            self.remove(address, adapter)
        self._held.pop(address, None)

    def touch(self, address: str, adapter: str) -> None:
        """A request for ``adapter`` went to ``address`` (least-recently-used order)."""
        held = self._held.get(address)
        if held is not None and adapter in held:
            held.move_to_end(adapter)

    # -- questions ----------------------------------------------------------------------

    def lists(self, adapter: str) -> bool:
        """Whether some server is known to hold ``adapter`` (it names an adapter)."""
        return adapter in self._where

    def knows(self, address: str) -> bool:
        """Whether ``address`` was listed (what it holds is known, not guessed)."""
        return address in self._held

    def held(self, address: str) -> list[str]:
        """The adapters ``address`` holds, least recently routed to first."""
        return list(self._held.get(address, ()))

    def holders(self, adapter: str, endpoints: Iterable[EndpointState]) -> frozenset[str]:
        """The addresses among ``endpoints`` that have ``adapter``: a listed server when
        it holds it (what it listed beats a report that may lag behind an unload), one
        never listed when it reports the adapter running or waiting."""
        where = self._where.get(adapter, ())
        out = set()
        for s in endpoints:
            if s.address in self._held:
                if s.address in where:
                    out.add(s.address)
            elif _reports(s.metrics, adapter):
                out.add(s.address)
        return frozenset(out)

    def listing(self) -> dict[str, list[str]]:
        """address -> its adapters, least recently used first (the admin API's view)."""
        return {a: list(held) for a, held in self._held.items()}


def _reports(m: EndpointMetrics | None, adapter: str) -> bool:
    return m is not None and (adapter in m.lora_running or adapter in m.lora_waiting)


def listed_adapters(doc: Any) -> list[str]:
    """The adapters of a ``GET /v1/models`` answer: the ids of its cards with a
    ``parent`` (vLLM's: the base model); ValueError for anything but such a list."""
    cards = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(cards, list):
        raise ValueError("no 'data' list of model cards")
    return [
        card["id"]
        for card in cards
        if isinstance(card, dict) and card.get("parent") and isinstance(card.get("id"), str)
    ]


def doubted(primary: str, status: int, served: str) -> tuple[str, ...]:
    """The servers a response to an adapter request casts doubt on (each may lack the
    adapter): the one it was sent to when Envoy answered from another (its retry after
    a 404 or a failure), and the one that answered 404 (vLLM's "The model does not
    exist")."""
    out = []
    if served and served != primary:
        out.append(primary)
    if status == 404:
        out.append(served or primary)
    return tuple(out)


def with_holders(
    targets: tuple[Endpoint, ...],
    holders: frozenset[str],
    endpoints: Iterable[EndpointState],
    in_flight: Mapping[str, int],
    limit: int,
) -> tuple[Endpoint, ...]:
    """``targets`` (the scheduler's picks for an adapter request, primary first) and
    then the other decode-capable ``holders``, least busy first, ``limit`` in all: the
    scheduler's filters may have kept fewer (only where the adapter is active), and a
    retry after a 404 or a failure must go to a server that has the adapter, not to any
    server of the cluster."""
    if len(targets) >= limit:
        return targets
    listed = {t.address for t in targets}
    more = sorted(
        (
            s
            for s in endpoints
            if s.address in holders
            and s.address not in listed
            and s.endpoint.role is not Role.PREFILL
        ),
        key=lambda s: (in_flight.get(s.address, 0), s.address),
    )
    return targets + tuple(s.endpoint for s in more[: limit - len(targets)])
