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
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from epp.common.usage import Usage
from epp.types import InferenceRequest, SchedulingResult

# The hooks, in the order a routed request meets them (the bus builds one tuple each).
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
)


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
