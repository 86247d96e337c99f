"""The phases of an ext_proc stream and every move between them, in one table (pure).

One HTTP request through Envoy is one stream. Envoy shows us the request, we answer it
(route it, or reject it with an immediate response), then Envoy shows us the response::

    REQUEST_HEADERS ──request_headers──▶ REQUEST_BODY ⟲ request_body
          │                                   │
          │ request_headers (end)             │ request_body (end), request_trailers
          ▼                                   │
       ROUTING ◀──────────────────────────────┘   scheduling; perhaps an EDS wait or
          │ routed                                 a prefill leg first
          ▼
       UPSTREAM ──response_headers──▶ RESPONSE_BODY ⟲ response_body
          │                                   │
          │ response_headers (end)            │ response_body (end), response_trailers
          ▼                                   │
        DONE ◀────────────────────────────────┘

    rejected (we sent an immediate response), closed (the gRPC stream ended): any ──▶ DONE
    stalled (we ended a streamed response whose server went silent): RESPONSE_BODY ──▶ CUT

In CUT, what Envoy still sends of the response gets no reply (``LATE``): the client's
response has ended already (epp.extproc.stall).

The response may also start before any request was routed: Envoy shows us the local
replies it makes itself (another filter's 401, a codec error, a request timeout, a
buffered body over its limit), in REQUEST_HEADERS (envoyproxy/envoy#38261) or in
REQUEST_BODY. And with ``response_header_mode: SKIP`` the response body or trailers come
without headers. So the response's messages move from REQUEST_HEADERS and REQUEST_BODY
as they do from UPSTREAM.

Every other (phase, message) pair gets a defined :class:`Answer` instead of a move:

* ``LATE``: a request message in DONE (Envoy sent it before it saw our immediate
  response, e.g. the rest of a body answered 413), or a response message in CUT (the
  rest of a response whose client's stream we ended). Envoy wants no reply to it.
* ``REJECT``: illegal while Envoy can still send the client a local reply (the response
  has not started): an immediate 500 with an OpenAI-style JSON error.
* ``END_STREAM``: illegal once the response started (or ended): no status can reach the
  client any more, so the gRPC stream ends with FAILED_PRECONDITION (Envoy's own code
  for an out-of-order message) and Envoy's failure mode decides the rest.

Both illegal answers end the request: its in-flight claims are released (once) and the
phase becomes DONE. Our own outcomes (routed, rejected, closed, stalled) move through the same
table; a missing entry there is a bug in the stream, not in the peer.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum, auto
from types import MappingProxyType

from envoy.service.ext_proc.v3.external_processor_pb2 import ProcessingRequest


class Phase(Enum):
    # hashed by identity (members are singletons): the transition table is looked up
    # with every message from Envoy, and Enum's own __hash__ is a call into Python
    __hash__ = object.__hash__

    REQUEST_HEADERS = auto()  # nothing seen yet
    REQUEST_BODY = auto()  # headers held, buffering the body
    ROUTING = auto()  # the request is whole; our answer is being prepared
    UPSTREAM = auto()  # routed; waiting for the response
    RESPONSE_BODY = auto()  # response streaming through
    CUT = auto()  # we ended the response (its server stalled); the stream is still open
    DONE = auto()  # answered or finished


class Message(Enum):
    """What Envoy sent: the ProcessingRequest's kind, and whether it ends its direction."""

    # (as Phase)
    __hash__ = object.__hash__

    REQUEST_HEADERS = "request_headers"
    REQUEST_HEADERS_END = "request_headers (end of stream)"
    REQUEST_BODY = "request_body"
    REQUEST_BODY_END = "request_body (end of stream)"
    REQUEST_TRAILERS = "request_trailers"
    RESPONSE_HEADERS = "response_headers"
    RESPONSE_HEADERS_END = "response_headers (end of stream)"
    RESPONSE_BODY = "response_body"
    RESPONSE_BODY_END = "response_body (end of stream)"
    RESPONSE_TRAILERS = "response_trailers"
    UNKNOWN = "message of no known kind"


class Outcome(Enum):
    """What we did: not a message, but it moves the phase too."""

    # (as Phase)
    __hash__ = object.__hash__

    ROUTED = auto()  # the routing answer is out
    REJECTED = auto()  # an immediate response is out
    CLOSED = auto()  # the gRPC stream ended (Envoy closed it, or we did)
    STALLED = auto()  # a streamed response's server went silent: we ended it


class Answer(Enum):
    """The answer to a message that makes no move (see the module docstring)."""

    LATE = auto()
    REJECT = auto()
    END_STREAM = auto()


# The response's messages, wherever the response may start (see the module docstring).
_RESPONSE_STARTS: dict[Message, Phase] = {
    Message.RESPONSE_HEADERS: Phase.RESPONSE_BODY,
    Message.RESPONSE_HEADERS_END: Phase.DONE,
    Message.RESPONSE_BODY: Phase.RESPONSE_BODY,
    Message.RESPONSE_BODY_END: Phase.DONE,
    Message.RESPONSE_TRAILERS: Phase.DONE,
}

_MOVES: dict[tuple[Phase, Message | Outcome], Phase] = {
    (Phase.REQUEST_HEADERS, Message.REQUEST_HEADERS): Phase.REQUEST_BODY,
    (Phase.REQUEST_HEADERS, Message.REQUEST_HEADERS_END): Phase.ROUTING,
    (Phase.REQUEST_BODY, Message.REQUEST_BODY): Phase.REQUEST_BODY,
    (Phase.REQUEST_BODY, Message.REQUEST_BODY_END): Phase.ROUTING,
    (Phase.REQUEST_BODY, Message.REQUEST_TRAILERS): Phase.ROUTING,
    (Phase.ROUTING, Outcome.ROUTED): Phase.UPSTREAM,
    **{
        (phase, message): after
        for phase in (Phase.REQUEST_HEADERS, Phase.REQUEST_BODY, Phase.UPSTREAM)
        for message, after in _RESPONSE_STARTS.items()
    },
    (Phase.RESPONSE_BODY, Message.RESPONSE_BODY): Phase.RESPONSE_BODY,
    (Phase.RESPONSE_BODY, Message.RESPONSE_BODY_END): Phase.DONE,
    (Phase.RESPONSE_BODY, Message.RESPONSE_TRAILERS): Phase.DONE,
    (Phase.RESPONSE_BODY, Outcome.STALLED): Phase.CUT,
    **{(phase, Outcome.REJECTED): Phase.DONE for phase in Phase},
    **{(phase, Outcome.CLOSED): Phase.DONE for phase in Phase},
}

# Where Envoy can still send the client a local reply: the response has not started.
_BEFORE_RESPONSE = frozenset(
    {Phase.REQUEST_HEADERS, Phase.REQUEST_BODY, Phase.ROUTING, Phase.UPSTREAM}
)


# What may still be on its way from Envoy when it takes our immediate response.
_LATE = frozenset({Message.REQUEST_BODY, Message.REQUEST_BODY_END, Message.REQUEST_TRAILERS})


def _answer(phase: Phase, message: Message) -> Answer:
    if phase is Phase.DONE and message in _LATE:
        return Answer.LATE
    if phase is Phase.CUT and message in _RESPONSE_STARTS:
        return Answer.LATE
    return Answer.REJECT if phase in _BEFORE_RESPONSE else Answer.END_STREAM


# The table: every (phase, message) pair -> the next phase or the answer; and each of
# our outcomes -> the next phase where it can happen.
TABLE: Mapping[tuple[Phase, Message | Outcome], Phase | Answer] = MappingProxyType(
    {
        **{(p, m): _answer(p, m) for p in Phase for m in Message if (p, m) not in _MOVES},
        **_MOVES,
    }
)


def message_of(msg: ProcessingRequest) -> Message:
    """The kind of one ProcessingRequest from Envoy."""
    kind = msg.WhichOneof("request")
    if kind == "request_headers":
        end = msg.request_headers.end_of_stream
        return Message.REQUEST_HEADERS_END if end else Message.REQUEST_HEADERS
    if kind == "request_body":
        return Message.REQUEST_BODY_END if body_ends(msg.request_body) else Message.REQUEST_BODY
    if kind == "request_trailers":
        return Message.REQUEST_TRAILERS
    if kind == "response_headers":
        end = msg.response_headers.end_of_stream
        return Message.RESPONSE_HEADERS_END if end else Message.RESPONSE_HEADERS
    if kind == "response_body":
        ends = body_ends(msg.response_body)
        return Message.RESPONSE_BODY_END if ends else Message.RESPONSE_BODY
    if kind == "response_trailers":
        return Message.RESPONSE_TRAILERS
    return Message.UNKNOWN


def body_ends(body: object) -> bool:
    """Whether an HttpBody is the last of its direction."""
    return bool(body.end_of_stream or body.end_of_stream_without_message)  # type: ignore[attr-defined]
