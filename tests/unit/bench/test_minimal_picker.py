"""The minimal picker's replies: the route in header and metadata alike, and the echoed
body in chunks Envoy accepts, the last one ending the stream."""

from __future__ import annotations

import pytest

from bench.minimal_picker import request_body, routed
from epp.extproc.messages import DESTINATION_HEADER, LB_NAMESPACE, MAX_CHUNK_BYTES


def test_the_route_names_one_endpoint_in_header_and_metadata() -> None:
    reply = routed("10.0.0.1:8000")
    common = reply.request_headers.response
    (option,) = common.header_mutation.set_headers
    assert (option.header.key, option.header.raw_value) == (DESTINATION_HEADER, b"10.0.0.1:8000")
    assert common.clear_route_cache
    lb = reply.dynamic_metadata.fields[LB_NAMESPACE].struct_value
    assert lb.fields[DESTINATION_HEADER].string_value == "10.0.0.1:8000"


@pytest.mark.parametrize(
    ("size", "chunks"),
    [
        (0, [0]),
        (1, [1]),
        (MAX_CHUNK_BYTES, [MAX_CHUNK_BYTES]),
        (MAX_CHUNK_BYTES + 1, [MAX_CHUNK_BYTES, 1]),
    ],
)
def test_the_body_is_echoed_in_order_in_chunks_envoy_accepts(size: int, chunks: list[int]) -> None:
    data = bytes(range(256)) * (size // 256) + bytes(size % 256)
    replies = [
        r.request_body.response.body_mutation.streamed_response for r in request_body(data, True)
    ]
    assert [len(r.body) for r in replies] == chunks
    assert b"".join(r.body for r in replies) == data
    assert [r.end_of_stream for r in replies] == [False] * (len(chunks) - 1) + [True]


def test_a_body_before_trailers_does_not_end_the_stream() -> None:
    assert not any(
        r.request_body.response.body_mutation.streamed_response.end_of_stream
        for r in request_body(b"x" * (MAX_CHUNK_BYTES + 1), False)
    )
