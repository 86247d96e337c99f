"""Build the ProcessingRequest messages Envoy sends, and read our replies back."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

from envoy.config.core.v3.base_pb2 import HeaderMap, HeaderValue
from envoy.extensions.filters.http.ext_proc.v3.processing_mode_pb2 import ProcessingMode
from envoy.service.ext_proc.v3.external_processor_pb2 import (
    HttpBody,
    HttpHeaders,
    ProcessingRequest,
    ProcessingResponse,
    ProtocolConfiguration,
)

if TYPE_CHECKING:
    from epp.extproc.stream import ExtProcStream, Step


def request_headers(
    extra: dict[str, str] | None = None,
    *,
    path: str = "/v1/completions",
    method: str = "POST",
    end_of_stream: bool = False,
    response_body_mode: int | None = None,
    request_body_mode: int = ProcessingMode.FULL_DUPLEX_STREAMED,
) -> ProcessingRequest:
    pairs = {":method": method, ":path": path, ":authority": "envoy", **(extra or {})}
    msg = ProcessingRequest(
        request_headers=HttpHeaders(
            headers=HeaderMap(
                headers=[HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs.items()]
            ),
            end_of_stream=end_of_stream,
        )
    )
    if response_body_mode is not None or request_body_mode != ProcessingMode.FULL_DUPLEX_STREAMED:
        msg.protocol_config.CopyFrom(
            ProtocolConfiguration(
                request_body_mode=request_body_mode,  # type: ignore[arg-type]
                response_body_mode=response_body_mode or ProcessingMode.STREAMED,  # type: ignore[arg-type]
            )
        )
    return msg


def request_body(data: bytes, end_of_stream: bool) -> ProcessingRequest:
    return ProcessingRequest(request_body=HttpBody(body=data, end_of_stream=end_of_stream))


def response_headers(status: int, end_of_stream: bool = False) -> ProcessingRequest:
    return ProcessingRequest(
        response_headers=HttpHeaders(
            headers=HeaderMap(headers=[HeaderValue(key=":status", raw_value=str(status).encode())]),
            end_of_stream=end_of_stream,
        )
    )


def response_body(data: bytes, end_of_stream: bool) -> ProcessingRequest:
    return ProcessingRequest(response_body=HttpBody(body=data, end_of_stream=end_of_stream))


def chunked(body: bytes, *cuts: int) -> list[ProcessingRequest]:
    """The body as Envoy would stream it, split at the given offsets."""
    bounds = [0, *sorted(cuts), len(body)]
    parts = [body[a:b] for a, b in itertools.pairwise(bounds)]
    return [request_body(p, i == len(parts) - 1) for i, p in enumerate(parts)]


def set_headers(reply: ProcessingResponse) -> dict[str, str]:
    mutation = reply.request_headers.response.header_mutation
    return {h.header.key: h.header.raw_value.decode() for h in mutation.set_headers}


def removed_headers(reply: ProcessingResponse) -> list[str]:
    return list(reply.request_headers.response.header_mutation.remove_headers)


def streamed_body(replies: list[ProcessingResponse]) -> tuple[bytes, bool]:
    """The request body we echoed back, and whether the last chunk ended the stream."""
    chunks = [r.request_body.response.body_mutation.streamed_response for r in replies]
    return b"".join(c.body for c in chunks), bool(chunks and chunks[-1].end_of_stream)


def replies(step: Step) -> list[ProcessingResponse]:
    """The replies of a step that neither waits nor ends the stream."""
    assert step.wait is None and not step.end_stream, step
    return list(step.replies)


async def settle(stream: ExtProcStream, step: Step) -> list[ProcessingResponse]:
    """What the driver sends once ``step``'s waits are over, one after the other (the
    replies that ask Envoy to wait, before the first, left out): the machine alone, no
    stream read beside the waits."""
    if step.wait is None:
        return replies(step)
    out: list[ProcessingResponse] = []
    while step.wait is not None:
        try:
            value = await step.wait
        except Exception as error:
            step = stream.on_wait_failed(error)
        else:
            step = stream.on_waited(value)
        out.extend(step.replies)
    return out
