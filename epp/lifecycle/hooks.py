"""The request lifecycle's hooks: what an observer is told, and when.

Contracts only (no implementation): the public plugin API re-exports these. An
observer implements the hooks it needs; the others default to doing nothing and are
never called (``epp.lifecycle.bus``). Hooks run on the request path, in the order the
observers were registered, synchronously: an observer must not block or await, and
should do little (count, log, note). An exception an observer raises reaches the
request's error handling, so observers must not raise.

Order for a request the EPP routes: ``before_scheduling``, ``picked``
(``decode_picked`` too when the decode endpoint is picked after the prefill leg),
``response_headers``, ``first_byte``, ``response_chunk`` per body chunk,
``response_complete``, then ``ended`` (in-flight accounting released) followed by
``response_status`` and ``answered`` when the server answered. A request the EPP
refuses gets ``rejected`` (and ``ended`` too if it had been routed). A stream the EPP
ends for silence gets ``ended`` then ``stalled``.

A disaggregated request whose P/D coordinator runs a prefill leg gets
``add_headers(routing, prefill)`` as the leg is about to start and ``prefill_done``
when it ended (after ``decode_picked``, if any); every routed request gets
``add_headers(routing, None)`` as its routing answer is built.

The exchange hooks follow one request from its headers to the end of its ext_proc
stream, routed or not, and are given its :class:`Exchange`: ``started`` (headers in),
``admitting`` (parsed; admission begins), ``held`` (flow control holds it),
``admitted`` (it is routed: after ``picked``), then ``closed`` (the stream ended,
after every other hook of the request). A request refused before admission gets only
``started`` and ``closed`` of them. The stream opens an exchange only when an observer
implements one of these hooks: otherwise a request costs nothing of them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from epp.common.usage import Usage
from epp.types import Endpoint, InferenceRequest, SchedulingResult

# The hooks (the bus builds one tuple each): a routed request's, in the order it meets
# them, then the prefill leg's and the exchange hooks (ordered in the docstring above).
HOOKS = (
    "before_scheduling",
    "picked",
    "decode_picked",
    "response_headers",
    "first_byte",
    "response_chunk",
    "response_complete",
    "ended",
    "response_status",
    "answered",
    "rejected",
    "stalled",
    "add_headers",
    "prefill_done",
    # the exchange hooks (EXCHANGE_HOOKS)
    "started",
    "admitting",
    "held",
    "admitted",
    "closed",
)
# the hooks given an Exchange: the stream opens one per request only when an observer
# implements one of them
EXCHANGE_HOOKS = ("started", "admitting", "held", "admitted", "closed")


class Routing(Protocol):
    """A routed request, as observers see it (read-only; one object per request,
    passed to every hook about it, so identity may key an observer's own state while
    the request lives)."""

    @property
    def request(self) -> InferenceRequest:
        """The parsed request as it was scheduled (model rewritten, subset narrowed)."""
        ...

    @property
    def result(self) -> SchedulingResult:
        """The pick: targets (primary first), the prefill endpoint, the deciding
        profile's scores and the P/D decision."""
        ...

    @property
    def decode_pending(self) -> bool:
        """The decode endpoint is picked after the prefill leg (``decode_picked``);
        until then ``result.targets`` are the first cycle's decode picks."""
        ...

    @property
    def flow_id(self) -> str | None:
        """The flow-control fairness id it was admitted under (None: flow control
        was off, or the request has no body)."""
        ...

    @property
    def routed_at(self) -> float:
        """The lifecycle clock when scheduling began (seconds, monotonic)."""
        ...

    @property
    def scheduling_s(self) -> float:
        """How long the pick took (wall time of the scheduling cycle)."""
        ...

    @property
    def sent_at(self) -> float:
        """The lifecycle clock when the pick was done."""
        ...

    @property
    def first_byte_at(self) -> float | None:
        """The lifecycle clock when the response body's first bytes passed."""
        ...

    @property
    def notes(self) -> list[Any]:
        """Per-request state of the observers that ask for it (``keeps_note``): one
        entry each, the index the bus gave it in ``note_index``."""
        ...


class Exchange(Protocol):
    """One request through its ext_proc stream, from its headers to the stream's end,
    as the exchange hooks see it (one object per request, passed to each of them).
    ``notes`` is the same list as its ``Routing``'s once it is routed, so an
    observer's per-request state is found from both."""

    @property
    def headers(self) -> Mapping[str, str]:
        """The request headers as the proxy sent them (pseudo-headers included)."""
        ...

    @property
    def request_id(self) -> str:
        """``x-request-id``, or the id the EPP generated when the client sent none."""
        ...

    @property
    def refused(self) -> tuple[int, str] | None:
        """The EPP's own error answer, if it gave one: its HTTP status and error code."""
        ...

    @property
    def notes(self) -> list[Any]:
        """Per-request state of the observers that ask for it (see ``Routing.notes``)."""
        ...


class LifecycleObserver(Protocol):
    """Told what happens to each request. Subclass it to inherit the no-op hooks,
    then override those you need.

    An observer that keeps per-request state sets ``keeps_note = True``; the bus then
    sets its ``note_index`` and each request's ``routing.notes[note_index]`` is the
    observer's (None until it writes there)."""

    keeps_note: bool = False
    note_index: int = -1

    def before_scheduling(self, request: InferenceRequest) -> None:
        """A request is about to be scheduled (admitted, or dispatched from a queue)."""
        return None

    def picked(self, routing: Routing) -> None:
        """The scheduling cycle picked its endpoints (``routing.decode_pending``: the
        decode endpoint comes later, in ``decode_picked``)."""
        return None

    def decode_picked(self, routing: Routing, moved: bool | None) -> None:
        """The decode endpoint was picked after the prefill leg: ``moved`` when it
        differs from the first cycle's; None when none could decode (503 follows)."""
        return None

    def response_headers(self, address: str, headers: Mapping[str, str]) -> None:
        """The response headers of a request routed to ``address`` arrived."""
        return None

    def first_byte(self, routing: Routing) -> None:
        """The response body's first bytes passed (``routing.first_byte_at``)."""
        return None

    def response_chunk(self, routing: Routing, size: int) -> None:
        """A response body chunk of ``size`` bytes passed (each one with data)."""
        return None

    def response_complete(
        self, routing: Routing, status: int, served: str, usage: Usage | None
    ) -> None:
        """The whole response passed: its status, the endpoint that served it when the
        proxy says (another than the primary: Envoy failed over), its usage if any."""
        return None

    def ended(self, routing: Routing) -> None:
        """The request is no longer in flight, however it ended (complete,
        abandoned by the client, an error, a stall, refused after routing)."""
        return None

    def response_status(self, address: str, status: int, served: str) -> None:
        """The status a request routed to ``address`` ended with (``served``: the
        endpoint that answered, when the proxy says)."""
        return None

    def answered(self, routing: Routing, status: int, served: str) -> None:
        """The model server's status for a routed request, once, when it ended."""
        return None

    def rejected(self, status: int, request: InferenceRequest | None) -> None:
        """The EPP answered a request itself with an error (``request``: None when it
        was refused before it was parsed)."""
        return None

    def stalled(self, address: str, served: str) -> None:
        """The EPP ended a streamed response whose server went silent."""
        return None

    def add_headers(self, routing: Routing, prefill: Endpoint | None) -> Iterable[tuple[str, str]]:
        """Headers to set on a request the EPP sends on: with ``prefill``, the prefill
        leg's request to that endpoint (asked once, as the leg is about to start); else
        the request routed to ``routing.result`` (asked once, as the routing answer is
        built). Each replaces the client's header of that name; for a name several
        observers set, the one registered last wins. A prefill leg the EPP runs sends on
        only the names its client forwards (``epp.disagg.legs.FORWARDED_HEADERS``)."""
        return ()

    def prefill_done(self, routing: Routing, error: str | None, decode: Endpoint | None) -> None:
        """The prefill leg ended: ``error``, what went wrong (answered to the client);
        ``decode``, where the request decodes, when the leg ran in the EPP and succeeded
        (None: it failed, or it only added headers for a sidecar). A leg cut short by
        the stream's end (the client left) gets none."""
        return None

    def started(self, exchange: Exchange) -> None:
        """A request's headers arrived (its body, if any, follows)."""
        return None

    def admitting(self, exchange: Exchange, request: InferenceRequest) -> None:
        """The parsed request enters admission (flow control, then scheduling)."""
        return None

    def held(self, exchange: Exchange, request: InferenceRequest) -> None:
        """Flow control holds the request: it waits from ``admitting`` on."""
        return None

    def admitted(self, exchange: Exchange, routing: Routing, priority: int) -> None:
        """The request is routed (after any wait in flow control); ``priority``: its
        flow-control band."""
        return None

    def closed(self, exchange: Exchange, status: int, outcome: str) -> None:
        """The ext_proc stream ended: ``outcome``, how (as ``epp_extproc_streams_total``
        counts it); ``status``, the response's HTTP status (0: none passed)."""
        return None
