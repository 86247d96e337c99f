"""One state machine per ext_proc stream (= one HTTP request through Envoy), sans I/O.

Envoy's protocol state (which phase we are in, which body modes Envoy uses) is kept
apart from the request's own state (headers, buffered body, routing claim). Which
message may come in which phase, and what follows it, is :mod:`epp.extproc.phases`'s
table; this module does what each message asks. The machine never awaits and owns no
task: each event in (a message from Envoy, or the end of a wait it asked for) gives one
:class:`Step` out (replies to send, perhaps something to wait for, or the end of the
stream), and :mod:`epp.extproc.driver` does the I/O for every transport.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum, auto
from typing import Any, Literal, cast

import orjson
from envoy.extensions.filters.http.ext_proc.v3.processing_mode_pb2 import ProcessingMode
from envoy.service.ext_proc.v3.external_processor_pb2 import (
    HttpHeaders,
    ProcessingRequest,
    ProcessingResponse,
)
from google.protobuf.struct_pb2 import Struct

from epp.common.apis import DEFAULT, Api, api_for
from epp.common.requestparse import parse_request
from epp.common.usage import TAIL_BYTES, Tail
from epp.disagg.coordinators import DecodeLeg
from epp.errors import BodyTooLargeError, ClientVisibleError
from epp.extproc import messages
from epp.extproc.conformance import SERVED_ECHO_HEADER
from epp.extproc.phases import TABLE, Answer, Message, Outcome, Phase, message_of
from epp.extproc.stall import ChunkWatch, Timers, stall_reply
from epp.flowcontrol.controller import Waiting
from epp.modelnames import REWRITE_HEADERS
from epp.observability.logsetup import REQUEST_ID
from epp.router import Received, Routed, Router
from epp.scheduling.plugins.selection import SELECTION_HEADER
from epp.types import InferenceRequest
from epp.xds.eds import EDS_SYNC_WAIT_S

log = logging.getLogger(__name__)

# Client-sent routing headers are never trusted: only the EPP sets them.
_STRIPPED_PREFIX = "x-gateway-destination-endpoint"
# the model-name rewrite headers and the conformance suite's endpoint selection are the
# EPP's to act on, not the model server's
_STRIPPED_EXACT = frozenset(
    {
        SELECTION_HEADER,
        "x-prefiller-host-port",
        "x-prefiller-fallbacks",
        messages.STREAM_HEADER,
        messages.RETRY_404_HEADER,
        *REWRITE_HEADERS,
    }
)
_FULL_DUPLEX = ProcessingMode.FULL_DUPLEX_STREAMED
_BUFFERED = ProcessingMode.BUFFERED
_EXT_PROC_FILTER = "envoy.filters.http.ext_proc"
UPSTREAM_ADDRESS = "upstream.address"
SUBSET_NAMESPACE = "envoy.lb.subset_hint"
SUBSET_KEY = "x-gateway-destination-endpoint-subset"
# the Endpoint Picker Protocol's report of the endpoint that served (envoy.lb metadata
# on the response path, from proxies that send it)
SERVED_KEY = "x-gateway-destination-endpoint-served"
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
_HEADERS_IN = (Message.REQUEST_HEADERS, Message.REQUEST_HEADERS_END)

# How an ext_proc stream ended: Envoy half-closed it (complete), reset it (cancelled),
# one of the two (ended: grpc.aio ends the request iterator alike for both), or our
# handler failed or ended it with an error status (error: see EndStream).
StreamEnd = Literal["complete", "cancelled", "ended", "error", "abandoned"]


@dataclass(frozen=True, slots=True)
class Step:
    """What the driver does after one event (a message, or the end of a wait): send
    ``replies`` in order; then, with a ``wait``, await it while reading the stream beside
    it and hand its outcome back (:meth:`ExtProcStream.on_waited`, or
    :meth:`ExtProcStream.on_wait_failed` with what it raised), which gives the next
    step. ``end_stream`` (never with replies or a wait): end the gRPC stream with
    FAILED_PRECONDITION and this reason: a message broke the protocol after the
    response started, when no immediate response can reach the client any more."""

    replies: Sequence[ProcessingResponse] = ()
    wait: Awaitable[Any] | None = None
    end_stream: str = ""


NOTHING = Step()  # buffering, or a message Envoy wants no reply to
# the steps whose one reply is always the same: shared, not built per message
_REQUEST_HEADERS_SEEN = Step((messages.EMPTY_REQUEST_HEADERS,))
_RESPONSE_HEADERS_SEEN = Step((messages.EMPTY_RESPONSE_HEADERS,))
_RESPONSE_BODY_SEEN = Step((messages.EMPTY_RESPONSE_BODY,))
_RESPONSE_TRAILERS_SEEN = Step((messages.EMPTY_RESPONSE_TRAILERS,))
# The error code of the immediate 500 that answers an illegal message.
PROTOCOL_ERROR = "extproc_protocol_error"


@dataclass(slots=True)
class _Envoy:
    """What we know of Envoy's side of the protocol on this stream."""

    phase: Phase = Phase.REQUEST_HEADERS
    request_body_mode: int = ProcessingMode.FULL_DUPLEX_STREAMED
    response_body_mode: int = ProcessingMode.STREAMED


@dataclass(slots=True)
class _Request:
    """The HTTP request's own state."""

    headers: dict[str, str] = field(default_factory=dict)
    request_id: str = ""
    generated_id: bool = False
    chunks: list[bytes] = field(default_factory=list)
    size: int = 0
    subset: frozenset[str] | None = None
    routed: Routed | None = None
    status: int = 0
    # the endpoint that answered, when the proxy says (envoy.lb metadata, else Envoy's
    # upstream.address attribute)
    served: str = ""
    tail: Tail = field(default_factory=Tail)  # the response's last bytes
    body_seen: bool = False  # a response body byte passed
    head: bytes = b""  # the response's first bytes, for an API whose usage starts there
    api: Api = DEFAULT  # the request API of its path (epp.common.apis)
    stream: bool = False  # the client asked for a streamed answer ("stream": true)


class _Awaiting(Enum):
    """What a routing answer waits for (each may follow the one before)."""

    SYNC = auto()  # an Envoy behind EDS to acknowledge our endpoints
    PLACEMENT = auto()  # the request's LoRA adapter to be loaded somewhere
    ADMISSION = auto()  # its turn in flow control
    PREFILL = auto()  # the coordinator's decode leg (a prefill leg may run first)


@dataclass(slots=True)
class _Routing:
    """A whole request on its way to its routing answer: what the rest of the way needs
    after a wait."""

    body: bytes | None
    end_of_stream: bool  # the answer's last body chunk ends the request (no trailers)
    trailers: bool  # the request's trailers came: their reply follows the answer
    awaiting: _Awaiting | None = None
    waited: bool = False  # Envoy was asked to wait already (it takes one extension)
    doc: dict[str, Any] | None = None
    rewritten: bool = False  # the model name was rewritten in ``doc``
    request: InferenceRequest | None = None  # once parsed and placed


# The one reply that answers an internal failure: a 500 to the client.
_INTERNAL = "internal error in the endpoint picker"
_DOING = {
    _Awaiting.SYNC: "routing",
    _Awaiting.PLACEMENT: "routing",
    _Awaiting.ADMISSION: "routing",
    _Awaiting.PREFILL: "preparing the decode leg",
}


class ExtProcStream:
    def __init__(
        self,
        router: Router,
        max_destinations: int = 1,
        timers: Timers | None = None,
        push: Callable[[ProcessingResponse], None] | None = None,
    ) -> None:
        self._router = router
        # a clock and timers (the driver's event loop) for a streamed response's silence,
        # and how to send a reply no message asked for (its end); without both, the
        # stream never ends a response itself
        self._timers = timers
        self._push = push
        self._watch: ChunkWatch | None = None  # a streamed response's silence (stall.py)
        # how many ip:port the Envoy config behind this stream can use (transport.py)
        self._max_destinations = max_destinations
        self._envoy = _Envoy()
        self._req = _Request()
        self._routing: _Routing | None = None  # while the routing answer is prepared
        self._subset_hint: frozenset[str] | None = None
        # the request's exchange, only when an observer follows exchanges (hooks.py)
        self._received: Received | None = None
        router.metrics.open_streams.inc()  # until close()

    @property
    def phase(self) -> Phase:
        return self._envoy.phase

    def on_message(self, msg: ProcessingRequest) -> Step:
        """The step for one message from Envoy: its replies (possibly none while
        buffering), a wait before the routing answer (EDS, an adapter load, flow
        control, a prefill leg), or the end of the stream for a message that breaks the
        protocol after the response started."""
        message = message_of(msg)
        step = self._advance(message)
        if isinstance(step, Answer):
            return self._answer(step, message)
        self._note(msg, message)
        try:
            if message in (Message.REQUEST_HEADERS, Message.REQUEST_HEADERS_END):
                return self._on_request_headers(msg.request_headers)
            if message in (Message.REQUEST_BODY, Message.REQUEST_BODY_END):
                end = message is Message.REQUEST_BODY_END
                return self._on_request_body(msg.request_body.body, end)
            if message is Message.REQUEST_TRAILERS:
                return self._complete_request(end_of_stream=False, trailers=True)
            if message in (Message.RESPONSE_HEADERS, Message.RESPONSE_HEADERS_END):
                return self._on_response_headers(msg.response_headers)
            if message in (Message.RESPONSE_BODY, Message.RESPONSE_BODY_END):
                end = message is Message.RESPONSE_BODY_END
                return self._on_response_body(msg.response_body.body, end)
            self._finish()  # response trailers: the one kind left that the table lets in
            return _RESPONSE_TRAILERS_SEEN
        except ClientVisibleError as error:
            return Step([self._reject(error)])
        except Exception:
            log.exception("request %s: internal error handling %s", self._req.request_id, message)
            return Step([self._reject(ClientVisibleError(_INTERNAL))])

    def on_waited(self, value: object) -> Step:
        """The wait the last step asked for is over and gave ``value``: the next step."""
        routing = self._routing
        assert routing is not None and routing.awaiting is not None, "no wait was asked"
        awaiting, routing.awaiting = routing.awaiting, None
        try:
            if awaiting is _Awaiting.PREFILL:
                step = self._prefilled(cast(DecodeLeg, value), routing)
            elif self._envoy.phase is Phase.DONE:  # the stream ended meanwhile
                if awaiting is _Awaiting.ADMISSION:
                    cast(Routed, value).release()
                return NOTHING
            elif awaiting is _Awaiting.SYNC:
                step = self._route(routing)
            elif awaiting is _Awaiting.PLACEMENT:
                step = self._schedule(cast(InferenceRequest, value), routing)
            else:
                assert routing.request is not None
                step = self._routed(cast(Routed, value), routing.request, routing)
        except ClientVisibleError as error:
            step = Step([self._reject(error)])
        except Exception:
            log.exception("request %s: internal error %s", self._req.request_id, _DOING[awaiting])
            step = Step([self._reject(ClientVisibleError(_INTERNAL))])
        return self._settled(step, routing)

    def on_wait_failed(self, error: Exception) -> Step:
        """The wait the last step asked for raised ``error``: the client's answer (its
        own error, or a 500)."""
        routing = self._routing
        assert routing is not None and routing.awaiting is not None, "no wait was asked"
        awaiting, routing.awaiting = routing.awaiting, None
        if self._envoy.phase is Phase.DONE:  # the stream ended meanwhile: nobody to tell
            return NOTHING
        if not isinstance(error, ClientVisibleError):
            log.error(
                "request %s: internal error %s",
                self._req.request_id,
                _DOING[awaiting],
                exc_info=error,
            )
            error = ClientVisibleError(_INTERNAL)
        return self._settled(Step([self._reject(error)]), routing)

    def close(self, end: StreamEnd = "complete") -> None:
        """The stream ended (EOF, cancel or error): release whatever the request holds.
        An end before the response's (client hung up) is counted as ``abandoned``."""
        if end in ("complete", "ended") and self._response_unfinished():
            end = "abandoned"
        self._advance(Outcome.CLOSED)
        self._finish()
        self._router.metrics.streams.labels(end).inc()
        self._router.metrics.open_streams.dec()
        received, self._received = self._received, None
        if received is not None:
            self._router.closed(received, self._req.status, end)

    def _advance(self, event: Message | Outcome) -> Phase | Answer:
        """The one place the phase changes: as the table says for ``event`` in it."""
        step = TABLE[self._envoy.phase, event]
        if isinstance(step, Phase):
            self._envoy.phase = step
        return step

    def _answer(self, answer: Answer, message: Message) -> Step:
        """The defined answer to a message that makes no move (phases.py)."""
        if answer is Answer.LATE:
            return NOTHING
        reason = f"ext_proc {message.value} is not allowed in phase {self.phase.name}"
        log.warning("request %s: %s", self._req.request_id or "(no headers yet)", reason)
        if answer is Answer.REJECT:
            return Step([self._reject(ClientVisibleError(reason, code=PROTOCOL_ERROR))])
        self._advance(Outcome.CLOSED)
        self._finish()
        return Step(end_stream=reason)

    def _note(self, msg: ProcessingRequest, message: Message) -> None:
        """What a message carries besides its kind: Envoy's body modes (on the first),
        the endpoint that answered (envoy.lb metadata or a response attribute), the
        proxy's subset hint (read with the request headers, the one message that uses
        it). Every message passes here, each response chunk too, so a metadata context
        without filter metadata costs one look."""
        if msg.HasField("protocol_config"):
            self._envoy.request_body_mode = msg.protocol_config.request_body_mode
            self._envoy.response_body_mode = msg.protocol_config.response_body_mode
        if msg.attributes:
            self._req.served = _upstream_address(msg) or self._req.served
        if msg.HasField("metadata_context"):
            filters = msg.metadata_context.filter_metadata
            if message in _HEADERS_IN:
                self._subset_hint = _subset_hint(filters)
            if filters:
                self._req.served = _served_metadata(filters) or self._req.served

    def _response_unfinished(self) -> bool:
        """Would this stream have seen the response end? Not when Envoy does not send
        response bodies (``lean``, ``buffered``): their end is the stream's end."""
        phase = self._envoy.phase
        if phase is Phase.RESPONSE_BODY:
            return bool(self._envoy.response_body_mode != ProcessingMode.NONE)
        return phase not in (Phase.DONE, Phase.CUT) and bool(self._req.headers)

    # -- request path -------------------------------------------------------------------
    def _on_request_headers(self, msg: HttpHeaders) -> Step:
        req = self._req
        for h in msg.headers.headers:
            req.headers[h.key] = h.raw_value.decode() if h.raw_value else h.value
        req.subset = self._subset_hint
        req.api = api_for(req.headers.get(":path", "/"))
        req.request_id = req.headers.get("x-request-id", "")
        if not req.request_id:
            req.request_id, req.generated_id = uuid.uuid4().hex, True
        REQUEST_ID.set(req.request_id)  # this stream's task: its log lines name it
        if self._router.hooks.exchanges:
            self._received = self._router.receive(req.headers, req.request_id)
        if msg.end_of_stream:  # nothing to wait for
            # GET /v1/models has no body by design; a POST without one is a client error.
            method = req.headers.get(":method", "GET")
            return self._complete(b"" if method in _BODY_METHODS else None, True, False)
        if self._envoy.request_body_mode == _BUFFERED:
            # Envoy sends the whole body only after this answer; we route on the body.
            return _REQUEST_HEADERS_SEEN
        return NOTHING

    def _on_request_body(self, data: bytes, end: bool) -> Step:
        req = self._req
        if data:
            req.size += len(data)
            if req.size > self._router.max_body_bytes:
                raise BodyTooLargeError(
                    f"request body exceeds the limit of {self._router.max_body_bytes} bytes",
                    code="body_too_large",
                )
            req.chunks.append(data)
        return self._complete_request(end_of_stream=True, trailers=False) if end else NOTHING

    def _complete_request(self, end_of_stream: bool, trailers: bool) -> Step:
        body = b"".join(self._req.chunks)
        self._req.chunks = []
        return self._complete(body, end_of_stream, trailers)

    def _complete(self, body: bytes | None, end_of_stream: bool, trailers: bool) -> Step:
        """The request is whole: on the way to its routing answer."""
        routing = self._routing = _Routing(body, end_of_stream, trailers)
        return self._settled(self._route(routing), routing)

    def _settled(self, step: Step, routing: _Routing) -> Step:
        """``step``, and once the routing answer is out (nothing more to wait for), the
        reply to the request's trailers after it."""
        if step.wait is not None:
            return step
        self._routing = None  # the body and the parsed request are not needed any more
        if routing.trailers:
            return Step([*step.replies, messages.EMPTY_REQUEST_TRAILERS])
        return step

    def _wait(
        self, routing: _Routing, awaiting: _Awaiting, until: Awaitable[Any], wait_s: float
    ) -> Step:
        """Wait for ``until`` before answering; Envoy, unless it was asked already, is
        asked to wait ``wait_s`` (the longest that may follow) for the answer."""
        routing.awaiting = awaiting
        if routing.waited:
            return Step(wait=until)
        routing.waited = True
        return Step([messages.extend_timeout(wait_s)], until)

    def _route(self, routing: _Routing) -> Step:
        """Schedule, then answer with the routing reply and (full duplex) the body; an
        adapter to load, flow control or a disaggregated request's decode leg may make
        the answer wait.

        Behind an EDS config (more than one destination), nothing is picked before an
        Envoy has acknowledged this process's endpoints: just after an EPP restart,
        Envoy may still hold the old process's list, and would fall back from a pick it
        does not know to one of those."""
        sync = self._router.envoy_sync
        if self._max_destinations > 1 and sync is not None and not sync.synced:
            cfg = self._router.flow.cfg  # Envoy may get one extension: the longest wait
            wait_s = EDS_SYNC_WAIT_S + cfg.max_queue_timeout_s + cfg.message_timeout_margin_s
            return self._wait(routing, _Awaiting.SYNC, sync.wait(), wait_s)
        req = self._req
        request, doc = parse_request(
            req.request_id,
            req.headers,
            routing.body,
            req.subset,
            self._router.chars_per_token,
            req.api,
        )
        resolved = self._router.resolve(request, doc)  # model rewrites, adapter catalogue
        routing.rewritten = resolved.doc is not None
        routing.doc = doc if resolved.doc is None else resolved.doc
        placed = self._router.place(resolved.request)  # an adapter loaded first?
        if not isinstance(placed, InferenceRequest):
            cfg = self._router.flow.cfg
            wait_s = cfg.max_queue_timeout_s + cfg.message_timeout_margin_s
            return self._wait(routing, _Awaiting.PLACEMENT, placed, wait_s)
        return self._schedule(placed, routing)

    def _schedule(self, request: InferenceRequest, routing: _Routing) -> Step:
        """Admission (flow control), then the routed reply."""
        size = len(routing.body or b"")
        admitted = self._router.admit(request, size, self._max_destinations, self._received)
        if isinstance(admitted, Waiting):  # held: Envoy is asked to wait that long
            routing.request = request
            wait_s = admitted.limit_s + self._router.flow.cfg.message_timeout_margin_s
            return self._wait(routing, _Awaiting.ADMISSION, admitted.result, wait_s)
        return self._routed(admitted, request, routing)

    def _routed(self, routed: Routed, request: InferenceRequest, routing: _Routing) -> Step:
        req = self._req
        req.routed = routed
        req.stream = request.stream
        doc = routing.doc
        if self._received is not None:
            self._router.admitted(self._received, routed)
        leg = None
        if doc is not None:
            leg = self._router.hand_off(routed, request, doc, routing.rewritten)
        if leg is None or isinstance(leg, DecodeLeg):
            return Step(self._forward(routing, leg))
        # a prefill leg runs first: Envoy is asked to wait for it
        margin_s = self._router.flow.cfg.message_timeout_margin_s
        return self._wait(routing, _Awaiting.PREFILL, leg, margin_s)

    def _prefilled(self, leg: DecodeLeg, routing: _Routing) -> Step:
        """The decode leg is ready (a prefill leg ran first): the routing answer."""
        if self._envoy.phase is Phase.DONE:  # the stream ended meanwhile
            if leg.prefill_ticket is not None:
                leg.prefill_ticket.release()
            return NOTHING
        return Step(self._forward(routing, leg))

    def _forward(self, routing: _Routing, leg: DecodeLeg | None) -> list[ProcessingResponse]:
        self._advance(Outcome.ROUTED)
        req = self._req
        routed = req.routed
        assert routed is not None
        body = routing.body
        extra: list[tuple[str, str]] = list(self._router.request_headers)
        rewritten = None
        if leg is not None:
            extra.extend(leg.headers)
            routed.prefill_ticket = leg.prefill_ticket
            if leg.doc is not None:
                rewritten = body = orjson.dumps(leg.doc)
        buffered = self._envoy.request_body_mode == _BUFFERED and body is not None
        if body is not None and (rewritten is not None or not buffered):
            extra.append(("content-length", str(len(body))))
        if req.generated_id:
            extra.append(("x-request-id", req.request_id))
        if req.stream:  # its own per-attempt idle timeout in the Envoy config
            extra.append((messages.STREAM_HEADER, "true"))
        if routed.adapter is not None:  # its list holds the adapter's holders only
            extra.append((messages.RETRY_404_HEADER, "true"))
        if self._router.hooks.add_headers:  # what observers add (a trace's context)
            extra.extend(self._router.hooks.headers_for(routed).items())
        setting = {k for k, _ in extra}
        remove = [
            k
            for k in req.headers
            if (k.startswith(_STRIPPED_PREFIX) and k != messages.DESTINATION_HEADER)
            or (k in _STRIPPED_EXACT and k not in setting)
        ]
        destination = routed.result.header_value
        if buffered:  # Envoy holds the body: replace it only if rewritten
            return [messages.routed(destination, extra, remove, on_body=True, body=rewritten)]
        reply = messages.routed(destination, extra, remove)
        if body is None:
            return [reply]
        return [reply, *messages.streamed_request_body(body, routing.end_of_stream)]

    def _reject(self, error: ClientVisibleError) -> ProcessingResponse:
        log.info("request %s rejected: %d %s", self._req.request_id, error.status, error.message)
        self._router.rejected(error, received=self._received)
        self._advance(Outcome.REJECTED)
        self._finish()
        return messages.immediate(error, self._req.api.error_body(error))

    # -- response path ------------------------------------------------------------------
    def _on_response_headers(self, msg: HttpHeaders) -> Step:
        headers = {
            h.key: h.raw_value.decode() if h.raw_value else h.value for h in msg.headers.headers
        }
        self._req.status = int(headers.get(":status") or 0)
        routed = self._req.routed
        if routed is not None:
            self._router.response_headers_seen(routed.ticket.address, headers)
        if msg.end_of_stream:
            self._finish()
        if self._router.echo_served_endpoint and self._req.served:
            return Step([messages.response_headers_set([(SERVED_ECHO_HEADER, self._req.served)])])
        return _RESPONSE_HEADERS_SEEN

    def _on_response_body(self, data: bytes, end: bool) -> Step:
        req = self._req
        routed = req.routed
        if self._watch is not None:
            self._watch.chunk()
        elif routed is not None and data and not req.body_seen:
            self._router.first_byte_seen(routed)
            self._watch_chunks()
        if data:
            req.body_seen = True
            if routed is not None:
                self._router.chunk_seen(routed, len(data))
            req.tail.add(data)
        if req.api.needs_head and len(req.head) < TAIL_BYTES:
            req.head += data[: TAIL_BYTES - len(req.head)]
        if end:
            if routed is not None and not routed.ticket.released:
                usage = req.api.usage(req.head, req.tail.bytes())
                self._router.completed(routed, req.status, req.served, usage)
            self._finish()
        if self._envoy.response_body_mode == _FULL_DUPLEX:
            return Step((messages.response_body_echo(data, end),))
        return _RESPONSE_BODY_SEEN

    def _watch_chunks(self) -> None:
        """From a stream's first byte on: end it if its server goes silent, where we can
        (the response body passes us full duplex, so we can send the client its end)."""
        timeout_s = self._router.stream_chunk_timeout_s
        timers = self._timers
        if (
            self._req.stream
            and timeout_s > 0
            and timers is not None
            and self._push is not None
            and self._envoy.response_body_mode == _FULL_DUPLEX
        ):
            self._watch = ChunkWatch(timers, timeout_s, self._stalled)

    def _stalled(self) -> None:
        """No chunk for the chunk timeout: the request leaves the endpoint's in-flight
        count, the stall counts against the endpoint, and the client gets the end of its
        stream (stall.py): a reply no message asked for, which the driver sends."""
        self._watch = None
        push = self._push
        if self._envoy.phase is not Phase.RESPONSE_BODY or push is None:
            return
        self._advance(Outcome.STALLED)
        req, routed = self._req, self._req.routed
        if routed is not None and not routed.ticket.released:
            routed.release()
            self._router.stalled(routed.ticket.address, req.served)
        path = req.headers.get(":path", "")
        timeout_s = self._router.stream_chunk_timeout_s
        push(stall_reply(timeout_s, req.tail.bytes(), path, req.request_id))

    def _finish(self) -> None:
        watch = self._watch
        if watch is not None:
            self._watch = None
            watch.stop()
        routed = self._req.routed
        if routed is not None and not routed.ticket.released:
            routed.release()
            if self._req.status:
                self._router.response_seen(
                    routed.ticket.address, self._req.status, self._req.served
                )
                self._router.answered(routed, self._req.status, self._req.served)


def _subset_hint(filters: Mapping[str, Struct]) -> frozenset[str] | None:
    """The proxy's ``envoy.lb.subset_hint`` list of ``ip:port``, if it sent one
    (``filters``: a message's ``metadata_context.filter_metadata``)."""
    hint = filters.get(SUBSET_NAMESPACE)
    if hint is None or SUBSET_KEY not in hint.fields:
        return None
    value = hint.fields[SUBSET_KEY]
    if value.HasField("list_value"):
        return frozenset(v.string_value for v in value.list_value.values if v.string_value)
    # tolerate a single string, possibly comma-separated
    return frozenset(a.strip() for a in value.string_value.split(",") if a.strip())


def _served_metadata(filters: Mapping[str, Struct]) -> str:
    """``envoy.lb`` metadata ``x-gateway-destination-endpoint-served``: the ``ip:port``
    that served, when the proxy reports it (the first, should it send a list)."""
    lb = filters.get(messages.LB_NAMESPACE)
    if lb is None or SERVED_KEY not in lb.fields:
        return ""
    value = lb.fields[SERVED_KEY]
    text: str = (
        value.list_value.values[0].string_value if value.list_value.values else value.string_value
    )
    return text.split(",", 1)[0].strip()


def _upstream_address(msg: ProcessingRequest) -> str:
    """The endpoint that answered, if the Envoy config asks for the ``upstream.address``
    response attribute (it differs from our primary when Envoy failed over)."""
    attrs = msg.attributes.get(_EXT_PROC_FILTER)
    if attrs is None or UPSTREAM_ADDRESS not in attrs.fields:
        return ""
    return str(attrs.fields[UPSTREAM_ADDRESS].string_value)
