"""Coordinators: how a disaggregated request's prefill and decode legs meet (the wire
flows: docs/architecture.md, P/D wire flows). Registered by name; the scheduler has
already chosen the prefill endpoint, and the decode endpoint too unless the coordinator
defers that pick until its prefill leg is done (``defers``; deferred decode selection:
docs/disaggregation.md).

Each one turns a :class:`Handoff` into the :class:`DecodeLeg` Envoy forwards: maybe a
header, maybe a rewritten body, after running the prefill leg itself or not. A prefill
server that cannot be reached, times out or fails (status outside 400-451) never fails
the request: the next prefill endpoint of the scheduler's ordered list gets the leg, and
when none is left the decode endpoint prefills on its own. A 400-451 goes back to the
client.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from epp.common.extensions import Installed, OpenRegistry
from epp.datastore import Datastore, InFlightTicket
from epp.disagg import bodies
from epp.disagg.legs import LegClient, LegFailed, LegResult
from epp.errors import PrefillRejectedError
from epp.observability.metrics import EppMetrics
from epp.types import Endpoint, InferenceRequest

log = logging.getLogger(__name__)

PREFILLER_HEADER = "x-prefiller-host-port"
# the sidecar's next prefill endpoints, in order, after the one PREFILLER_HEADER names
# (llm-d's sidecar reads PREFILLER_HEADER as exactly one host:port, so they go apart)
PREFILLER_FALLBACKS_HEADER = "x-prefiller-fallbacks"
BOOTSTRAP_PORT_LABEL = "bootstrap-port"


# Deferred decode selection: the scheduler's decode pick now, outside the endpoint that
# ran the prefill leg (None: none did, the decode endpoint prefills alone); the router
# moves the request's claim onto it. Raises NoEndpointError when none can decode.
DecodePick = Callable[[Endpoint | None], Endpoint]


@dataclass(frozen=True, slots=True)
class Handoff:
    request: InferenceRequest
    doc: Mapping[str, Any]  # the client's JSON body
    prefill: Endpoint
    # None: not chosen yet (a coordinator that defers calls choose_decode after its leg)
    decode: Endpoint | None
    # where the prefill leg goes next when ``prefill`` fails, in order
    prefill_fallbacks: tuple[Endpoint, ...] = ()
    pick_decode: DecodePick | None = None  # set when the decode pick is deferred

    @property
    def prefills(self) -> tuple[Endpoint, ...]:
        return (self.prefill, *self.prefill_fallbacks)

    def choose_decode(self, prefilled_on: Endpoint | None) -> Endpoint:
        """The decode endpoint, once the prefill leg is done (call it once): the one
        chosen up front, or the scheduler's pick now when it was deferred.
        ``prefilled_on``: the endpoint that ran the leg (left out of the pick)."""
        if self.pick_decode is None:
            assert self.decode is not None
            return self.decode
        return self.pick_decode(prefilled_on)


@dataclass(frozen=True, slots=True)
class DecodeLeg:
    """What Envoy sends to the decode endpoint."""

    doc: Mapping[str, Any] | None = None  # a rewritten body; None: the client's, unchanged
    headers: tuple[tuple[str, str], ...] = ()
    # the prefill endpoint's load claim when the leg runs outside the EPP (sidecar):
    # held until the request ends
    prefill_ticket: InFlightTicket | None = None


class Coordinator(Protocol):
    name: str
    # True: the router leaves the decode pick to it (Handoff.decode None), and it calls
    # Handoff.choose_decode once its prefill leg is done (an installed coordinator
    # without the attribute never defers)
    defers: bool

    def hand_off(self, handoff: Handoff) -> DecodeLeg | Awaitable[DecodeLeg]:
        """The decode leg for ``handoff``: returned at once, or awaited when the EPP runs
        the prefill leg first. May raise PrefillRejectedError."""
        ...

    async def close(self) -> None:
        """Finish or cancel background legs (shutdown)."""
        ...


@dataclass
class CoordinatorEnv:
    datastore: Datastore
    metrics: EppMetrics
    client: LegClient
    rng: random.Random
    bootstrap_port: int | None = None
    # failure accounting: told the prefill server that answered a leg well, and the one
    # that failed a leg (address, reason, serving: it answered with a 5xx)
    on_success: Callable[[str], None] | None = None
    on_failure: Callable[[str, str, bool], None] | None = None
    # all of a request's prefill attempts together, shared out equally among its prefill
    # endpoints; past it the request decodes alone. None: only the transport's timeouts
    prefill_budget_s: float | None = None
    # pick the decode endpoint after the prefill leg (disaggregation.deferDecode), for
    # the coordinators that can
    defer_decode: bool = False


class PrefillLegs:
    """Runs one prefill leg: counts it against the prefill endpoint's in-flight load,
    records its time and outcome, and sorts failures from client errors."""

    def __init__(self, env: CoordinatorEnv, coordinator: str) -> None:
        self.env = env
        self.coordinator = coordinator
        self._seconds = env.metrics.prefill_leg_seconds.labels(coordinator)

    def count(self, outcome: str) -> None:
        self.env.metrics.prefill_legs.labels(self.coordinator, outcome).inc()

    async def run(
        self,
        h: Handoff,
        doc: Mapping[str, Any],
        *,
        count_ok: bool = True,
    ) -> tuple[Endpoint, LegResult] | None:
        """The first good prefill answer from ``h.prefills`` in order, with the endpoint
        that gave it, or None when the decode endpoint must prefill alone (every one
        failed). The budget is shared out
        equally, so that one that hangs leaves time for the next; with one endpoint it
        gets the whole budget. Each attempt is counted once: ``count_ok=False`` leaves a
        2xx leg's outcome to the caller, which still has to judge the answer. A 400-451
        is the client's error: raised at once, no other endpoint tried."""
        budget = self.env.prefill_budget_s
        share = None if budget is None else budget / len(h.prefills)
        for prefill in h.prefills:
            try:
                async with asyncio.timeout(share):
                    result = await self.attempt(h, prefill, doc, count_ok=count_ok)
            except TimeoutError:
                self.count("failed")
                reason = f"prefill leg failed: no answer within {share:g}s"
                log.warning("request %s: %s from %s", h.request.request_id, reason, prefill.address)
                if self.env.on_failure is not None:
                    self.env.on_failure(prefill.address, reason, False)
                continue
            if result is not None:
                return prefill, result
        return None

    async def attempt(
        self,
        h: Handoff,
        prefill: Endpoint,
        doc: Mapping[str, Any],
        connected: asyncio.Event | None = None,
        *,
        count_ok: bool = True,
    ) -> LegResult | None:
        """One prefill leg on ``prefill``: its answer, or None when it failed."""
        rid = h.request.request_id
        ticket = self.env.datastore.acquire(prefill.address, h.request.prompt_tokens)
        # the id Envoy's client sent, or the one the EPP generated for both legs
        headers = {**h.request.headers, "x-request-id": rid}
        try:
            result = await self.env.client.post(prefill, h.request.path, doc, headers, connected)
        except LegFailed as exc:
            self.count("failed")
            log.warning("request %s: prefill leg failed (%s)", rid, exc)
            if self.env.on_failure is not None:
                self.env.on_failure(prefill.address, f"prefill leg failed: {exc}", False)
            return None
        finally:
            ticket.release()
        self._seconds.observe(result.seconds)
        if 400 <= result.status <= 451:
            self.count("rejected")
            raise PrefillRejectedError(
                result.status,
                result.body,
                f"the prefill server {prefill.address} rejected the request (HTTP {result.status})",
            )
        if not 200 <= result.status < 300:
            self.count("failed")
            log.warning(
                "request %s: prefill leg on %s answered %d", rid, prefill.address, result.status
            )
            if self.env.on_failure is not None and result.status >= 500:
                reason = f"prefill leg answered HTTP {result.status}"
                self.env.on_failure(prefill.address, reason, True)
            return None
        if self.env.on_success is not None:
            self.env.on_success(prefill.address)
        if count_ok:
            self.count("ok")
        return result


class SidecarCoordinator:
    """llm-d's protocol: name the prefill endpoint in ``x-prefiller-host-port`` and route
    to the decode endpoint, whose sidecar (``epp sidecar``) runs both legs."""

    name = "sidecar"
    # the decode endpoint is where the sidecar runs the prefill leg: chosen up front
    defers = False

    def __init__(self, env: CoordinatorEnv) -> None:
        self.env = env

    def hand_off(self, handoff: Handoff) -> DecodeLeg:
        ticket = self.env.datastore.acquire(handoff.prefill.address, handoff.request.prompt_tokens)
        headers = [(PREFILLER_HEADER, handoff.prefill.address)]
        if handoff.prefill_fallbacks:
            fallbacks = ",".join(p.address for p in handoff.prefill_fallbacks)
            headers.append((PREFILLER_FALLBACKS_HEADER, fallbacks))
        return DecodeLeg(headers=tuple(headers), prefill_ticket=ticket)

    async def close(self) -> None:
        pass


class NixlCoordinator:
    """vLLM's NIXL pull flow run by the EPP: prefill leg first, then the decode body
    carries the returned ``kv_transfer_params``. No sidecar needed."""

    name = "nixl"

    def __init__(self, env: CoordinatorEnv) -> None:
        self.legs = PrefillLegs(env, self.name)
        # any decode server can pull the blocks kv_transfer_params name
        self.defers = env.defer_decode

    async def hand_off(self, handoff: Handoff) -> DecodeLeg:
        answered = await self.legs.run(handoff, bodies.nixl_prefill(handoff.doc), count_ok=False)
        if answered is None:
            handoff.choose_decode(None)
            return DecodeLeg()
        prefill, result = answered
        params = bodies.returned_kv_params(result.json())
        self.legs.count("ok" if params is not None else "no_kv_params")
        if params is None:
            log.warning(
                "request %s: prefill on %s returned no kv_transfer_params; decode alone",
                handoff.request.request_id,
                prefill.address,
            )
            handoff.choose_decode(None)
            return DecodeLeg()
        handoff.choose_decode(prefill)
        return DecodeLeg(doc=bodies.nixl_decode(handoff.doc, params))

    async def close(self) -> None:
        pass


class KvPoolCoordinator:
    """Shared KV pool (Mooncake store, LMCache): a one-token prefill leg fills the pool,
    then the decode endpoint gets the same prompt and finds its KV there."""

    name = "kv-pool"

    def __init__(self, env: CoordinatorEnv) -> None:
        self.legs = PrefillLegs(env, self.name)
        # every decode server reads the same pool
        self.defers = env.defer_decode

    async def hand_off(self, handoff: Handoff) -> DecodeLeg:
        answered = await self.legs.run(handoff, bodies.one_token(handoff.doc))
        handoff.choose_decode(None if answered is None else answered[0])
        return DecodeLeg()

    async def close(self) -> None:
        pass


class ConcurrentCoordinator:
    """SGLang (and its Mooncake transfer backend): the same body, naming a bootstrap
    rendezvous, goes to both servers at once; each waits for the other, so a sequential
    proxy would deadlock. The EPP fires the prefill leg, and routes the decode leg as
    soon as the prefill request is on the wire (a dead prefill server: decode alone)."""

    name = "concurrent"
    # both legs must be on the wire at once (the rendezvous): the decode endpoint is
    # chosen before the prefill leg can finish
    defers = False

    def __init__(self, env: CoordinatorEnv) -> None:
        self.env = env
        self.legs = PrefillLegs(env, self.name)
        self._tasks: set[asyncio.Task[None]] = set()

    async def hand_off(self, handoff: Handoff) -> DecodeLeg:
        """Fire the leg on each prefill endpoint in turn until one is on the wire; the
        decode leg then names that one's rendezvous. Once a leg is on the wire the
        decode leg is bound to it: a later failure cannot move to another endpoint."""
        for prefill in handoff.prefills:
            doc = await self._fire(handoff, prefill)
            if doc is not None:
                return DecodeLeg(doc=doc)
        return DecodeLeg()

    async def _fire(self, handoff: Handoff, p: Endpoint) -> Mapping[str, Any] | None:
        """The decode body naming ``p``'s rendezvous once its leg is on the wire, or
        None when ``p`` cannot be reached."""
        room = bodies.new_bootstrap_room(self.env.rng)
        port = _bootstrap_port(p, self.env.bootstrap_port)
        doc = bodies.with_bootstrap(handoff.doc, p.host, port, room)
        connected = asyncio.Event()
        task = asyncio.create_task(self._prefill(handoff, p, doc, connected))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        waiter = asyncio.create_task(connected.wait())
        try:
            await asyncio.wait((task, waiter), return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # Envoy gave up before the decode leg was routed
            task.cancel()
            raise
        finally:
            waiter.cancel()
        return doc if connected.is_set() else None

    async def _prefill(
        self, h: Handoff, p: Endpoint, doc: Mapping[str, Any], connected: asyncio.Event
    ) -> None:
        try:
            await self.legs.attempt(h, p, doc, connected)
        except PrefillRejectedError as exc:  # the decode leg, same body, answers the client
            log.info("request %s: %s", h.request.request_id, exc.message)
        except Exception:  # a background task: nobody else would see it
            log.exception("request %s: prefill leg crashed", h.request.request_id)

    async def close(self) -> None:
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=5)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def _bootstrap_port(prefill: Endpoint, configured: int | None) -> int:
    """Where the prefill server's bootstrap rendezvous listens: the endpoint's
    ``bootstrap-port`` label, else ``disaggregation.bootstrapPort``, else the endpoint's
    own port (our simulator; real SGLang listens on --disaggregation-bootstrap-port)."""
    label = prefill.labels.get(BOOTSTRAP_PORT_LABEL)
    if label is not None and label.isdigit():
        return int(label)
    return configured or prefill.port


CoordinatorFactory = Callable[[CoordinatorEnv], Coordinator]


def _factory(obj: object, name: str) -> CoordinatorFactory:
    if not callable(obj):
        raise TypeError(f"expected a callable (CoordinatorEnv) -> Coordinator, got {obj!r}")
    return obj  # callable() cannot check the signature


# by name; installed packages add more (entry-point group epp.coordinators)
COORDINATORS: OpenRegistry[CoordinatorFactory] = OpenRegistry(
    {
        SidecarCoordinator.name: SidecarCoordinator,
        NixlCoordinator.name: NixlCoordinator,
        ConcurrentCoordinator.name: ConcurrentCoordinator,
        KvPoolCoordinator.name: KvPoolCoordinator,
    },
    Installed("epp.coordinators", "coordinator", _factory),
)
