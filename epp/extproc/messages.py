"""Builders for the ext_proc protobuf replies we send to Envoy (no state, no I/O)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from envoy.config.core.v3.base_pb2 import HeaderValue, HeaderValueOption
from envoy.service.ext_proc.v3.external_processor_pb2 import (
    BodyResponse,
    CommonResponse,
    HeaderMutation,
    HeadersResponse,
    ImmediateResponse,
    ProcessingResponse,
    TrailersResponse,
)
from envoy.type.v3.http_status_pb2 import HttpStatus
from google.protobuf.struct_pb2 import Struct

from epp.errors import DROPPED_REASON_HEADER, ClientVisibleError

# Envoy rejects larger streamed_response chunks (docs/architecture.md, Endpoint Picker Protocol).
MAX_CHUNK_BYTES = 62_000
DESTINATION_HEADER = "x-gateway-destination-endpoint"
# Set on streaming requests (``"stream": true``) so the Envoy config can give them their
# own per-attempt idle timeout; Envoy removes it before the model server sees it.
STREAM_HEADER = "x-epp-stream"
# Set on requests for a LoRA adapter, whose destination list holds only servers with it:
# the Envoy config retries their 404 ("The model `x` does not exist.": a server that lost
# the adapter) on the next of the list; Envoy removes it before the model server sees it.
RETRY_404_HEADER = "x-epp-retry-404"
LB_NAMESPACE = "envoy.lb"

_OVERWRITE = HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD


def header_mutation(
    set_headers: Iterable[tuple[str, str]] = (), remove: Iterable[str] = ()
) -> HeaderMutation:
    return HeaderMutation(
        set_headers=[
            HeaderValueOption(
                header=HeaderValue(key=k, raw_value=v.encode()), append_action=_OVERWRITE
            )
            for k, v in set_headers
        ],
        remove_headers=list(remove),
    )


def routed(
    destination: str,
    set_headers: Iterable[tuple[str, str]],
    remove: Iterable[str],
    *,
    on_body: bool = False,
    body: bytes | None = None,
) -> ProcessingResponse:
    """The reply that routes the request: header and ``envoy.lb`` metadata carry the
    same value (Endpoint Picker Protocol). It answers ``request_headers`` (streamed
    bodies, body-less requests) or, with ``on_body``, a BUFFERED ``request_body``: Envoy
    still holds the headers then, so the mutation applies and the body needs no echo
    (``body`` replaces it, e.g. a P/D decode body)."""
    metadata = Struct()
    metadata.get_or_create_struct(LB_NAMESPACE)[DESTINATION_HEADER] = destination
    common = CommonResponse(
        header_mutation=header_mutation([(DESTINATION_HEADER, destination), *set_headers], remove),
        clear_route_cache=True,
    )
    if not on_body:
        return ProcessingResponse(
            request_headers=HeadersResponse(response=common), dynamic_metadata=metadata
        )
    reply = ProcessingResponse(
        request_body=BodyResponse(response=common), dynamic_metadata=metadata
    )
    if body is not None:  # set in place: a constructor would copy it once per level
        reply.request_body.response.body_mutation.body = body
    return reply


def streamed_request_body(body: bytes, end_of_stream: bool) -> Iterator[ProcessingResponse]:
    """The (possibly rewritten) request body as FULL_DUPLEX_STREAMED replies, in chunks
    of at most MAX_CHUNK_BYTES; an empty body still yields one (end-of-stream) reply."""
    if not body:
        yield _request_body_chunk(b"", end_of_stream)
        return
    last = len(body)
    for start in range(0, last, MAX_CHUNK_BYTES):
        end = min(start + MAX_CHUNK_BYTES, last)
        yield _request_body_chunk(body[start:end], end_of_stream and end == last)


def _request_body_chunk(data: bytes, end_of_stream: bool) -> ProcessingResponse:
    reply = ProcessingResponse()
    _fill_streamed(reply.request_body, data, end_of_stream)
    return reply


def _fill_streamed(body_response: BodyResponse, data: bytes, end_of_stream: bool) -> None:
    """Set a streamed body chunk in place (one copy of ``data``, not one per level)."""
    streamed = body_response.response.body_mutation.streamed_response
    streamed.body = data
    streamed.end_of_stream = end_of_stream


def response_body_echo(data: bytes, end_of_stream: bool) -> ProcessingResponse:
    """Pass a response chunk through unchanged in FULL_DUPLEX_STREAMED response mode."""
    reply = ProcessingResponse()
    _fill_streamed(reply.response_body, data, end_of_stream)
    return reply


def immediate(error: ClientVisibleError, body: bytes | None = None) -> ProcessingResponse:
    """An error answered by Envoy on our behalf, a JSON body (``body``: in the shape of
    the request's API; by default OpenAI's); a dropped request also says why
    (``x-llm-d-request-dropped-reason``)."""
    headers = [("content-type", "application/json")]
    if error.retry_after_s is not None:
        headers.append(("retry-after", str(error.retry_after_s)))
    if error.dropped_reason is not None:
        headers.append((DROPPED_REASON_HEADER, error.dropped_reason))
    return ProcessingResponse(
        immediate_response=ImmediateResponse(
            status=HttpStatus(code=error.status),
            headers=header_mutation(headers),
            body=error.body() if body is None else body,
            details=f"epp_{error.code or error.error_type}",
        )
    )


def extend_timeout(seconds: float) -> ProcessingResponse:
    """Ask Envoy to wait up to ``seconds`` for our answer to the message it sent last
    (``override_message_timeout``; honoured up to the filter's ``max_message_timeout``,
    once per processing state): sent when a request starts to wait in a queue."""
    reply = ProcessingResponse()
    reply.override_message_timeout.FromMilliseconds(max(1, round(seconds * 1000)))
    return reply


# Replies that change nothing; built once, they are immutable in practice.
EMPTY_REQUEST_HEADERS = ProcessingResponse(request_headers=HeadersResponse())
EMPTY_REQUEST_TRAILERS = ProcessingResponse(request_trailers=TrailersResponse())
EMPTY_RESPONSE_HEADERS = ProcessingResponse(response_headers=HeadersResponse())
EMPTY_RESPONSE_BODY = ProcessingResponse(response_body=BodyResponse())
EMPTY_RESPONSE_TRAILERS = ProcessingResponse(response_trailers=TrailersResponse())


def response_headers_set(headers: Iterable[tuple[str, str]]) -> ProcessingResponse:
    """The reply to response headers that sets ``headers`` on the client's response."""
    common = CommonResponse(header_mutation=header_mutation(headers))
    return ProcessingResponse(response_headers=HeadersResponse(response=common))
