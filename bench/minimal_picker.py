"""A minimal Python endpoint picker: bench.overhead's yardstick for what an ext_proc
server written in Python costs at least.

It speaks what Envoy's config for the EPP expects (epp_harness.envoyconfig, ``full``
processing) and nothing more: grpcio's asyncio server (on uvloop where installed),
full-duplex ext_proc. Per stream it holds the request headers' answer until the body
has all arrived, picks the next endpoint round robin, answers with the destination
header and the same value in ``envoy.lb`` metadata (the Endpoint Picker Protocol),
echoes the body back in chunks Envoy accepts, and passes the response through. It also
serves the model-server cluster over EDS once, as the EPP does, so one Envoy config
routes by either.

No needless work, so it is a fair competitor: the routing replies are built once per
endpoint, the body is not parsed, nothing is counted or logged per request.

    python -m bench.minimal_picker --endpoint 127.0.0.1:8000 --grpc-port 0 --ready-file F
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
from envoy.config.core.v3.address_pb2 import Address, SocketAddress
from envoy.config.core.v3.base_pb2 import HeaderValue, HeaderValueOption
from envoy.config.endpoint.v3.endpoint_components_pb2 import (
    Endpoint,
    LbEndpoint,
    LocalityLbEndpoints,
)
from envoy.config.endpoint.v3.endpoint_pb2 import ClusterLoadAssignment
from envoy.service.discovery.v3.discovery_pb2 import DiscoveryRequest, DiscoveryResponse
from envoy.service.endpoint.v3 import eds_pb2_grpc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc
from envoy.service.ext_proc.v3.external_processor_pb2 import (
    CommonResponse,
    HeaderMutation,
    HeadersResponse,
    ProcessingRequest,
    ProcessingResponse,
    TrailersResponse,
)
from google.protobuf.struct_pb2 import Struct

from epp.common.readyfile import write_ready
from epp.extproc.messages import DESTINATION_HEADER, LB_NAMESPACE, MAX_CHUNK_BYTES
from epp.xds.eds import EDS_TYPE_URL, MODEL_CLUSTER

# the answers that carry nothing: one object each, sent as often as asked
_RESPONSE_HEADERS = ProcessingResponse(response_headers=HeadersResponse())
_REQUEST_TRAILERS = ProcessingResponse(request_trailers=TrailersResponse())
_RESPONSE_TRAILERS = ProcessingResponse(response_trailers=TrailersResponse())


def routed(address: str) -> ProcessingResponse:
    """The answer to ``request_headers`` that sends the request to ``address``."""
    metadata = Struct()
    metadata.get_or_create_struct(LB_NAMESPACE)[DESTINATION_HEADER] = address
    option = HeaderValueOption(
        header=HeaderValue(key=DESTINATION_HEADER, raw_value=address.encode()),
        append_action=HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
    )
    common = CommonResponse(
        header_mutation=HeaderMutation(set_headers=[option]), clear_route_cache=True
    )
    return ProcessingResponse(
        request_headers=HeadersResponse(response=common), dynamic_metadata=metadata
    )


def request_body(data: bytes, end_of_stream: bool) -> Iterator[ProcessingResponse]:
    """``data`` echoed as streamed request-body answers of at most MAX_CHUNK_BYTES."""
    last = len(data)
    for start in range(0, max(last, 1), MAX_CHUNK_BYTES):
        reply = ProcessingResponse()
        chunk = reply.request_body.response.body_mutation.streamed_response
        chunk.body = data[start : start + MAX_CHUNK_BYTES]
        chunk.end_of_stream = end_of_stream and start + MAX_CHUNK_BYTES >= last
        yield reply


class Picker(external_processor_pb2_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    def __init__(self, endpoints: list[str]) -> None:
        self._routes = [routed(a) for a in endpoints]
        self._next = 0

    def _pick(self) -> ProcessingResponse:
        route = self._routes[self._next]
        self._next = (self._next + 1) % len(self._routes)
        return route

    async def Process(
        self, request_iterator: AsyncIterator[ProcessingRequest], context: object
    ) -> AsyncIterator[ProcessingResponse]:
        body: list[bytes] = []
        routed_yet = False
        async for message in request_iterator:
            kind = message.WhichOneof("request")
            if kind == "response_body":
                part = message.response_body
                reply = ProcessingResponse()
                chunk = reply.response_body.response.body_mutation.streamed_response
                chunk.body = part.body
                chunk.end_of_stream = part.end_of_stream
                yield reply
            elif kind == "request_body":
                body.append(message.request_body.body)
                if message.request_body.end_of_stream:
                    routed_yet = True
                    yield self._pick()
                    for reply in request_body(b"".join(body), True):
                        yield reply
            elif kind == "request_headers":
                if message.request_headers.end_of_stream:  # no body to wait for
                    routed_yet = True
                    yield self._pick()
            elif kind == "response_headers":
                yield _RESPONSE_HEADERS
            elif kind == "request_trailers":
                if not routed_yet:  # the body ended without end_of_stream
                    routed_yet = True
                    yield self._pick()
                    for reply in request_body(b"".join(body), False):
                        yield reply
                yield _REQUEST_TRAILERS
            elif kind == "response_trailers":
                yield _RESPONSE_TRAILERS


class Eds(eds_pb2_grpc.EndpointDiscoveryServiceServicer):  # type: ignore[misc]
    """The endpoints, sent once per EDS stream; later requests are acknowledgements."""

    def __init__(self, endpoints: list[str]) -> None:
        hosts = [a.rsplit(":", 1) for a in endpoints]
        assignment = ClusterLoadAssignment(
            cluster_name=MODEL_CLUSTER,
            endpoints=[
                LocalityLbEndpoints(
                    lb_endpoints=[
                        LbEndpoint(
                            endpoint=Endpoint(
                                address=Address(
                                    socket_address=SocketAddress(address=h, port_value=int(p))
                                )
                            )
                        )
                        for h, p in hosts
                    ]
                )
            ],
        )
        self._response = DiscoveryResponse(version_info="1", type_url=EDS_TYPE_URL, nonce="1")
        self._response.resources.add().Pack(assignment)

    async def StreamEndpoints(
        self, request_iterator: AsyncIterator[DiscoveryRequest], context: object
    ) -> AsyncIterator[DiscoveryResponse]:
        sent = False
        async for _ in request_iterator:
            if not sent:
                sent = True
                yield self._response


async def serve(endpoints: list[str], host: str, port: int, ready_file: Path | None) -> None:
    server = grpc.aio.server()
    external_processor_pb2_grpc.add_ExternalProcessorServicer_to_server(Picker(endpoints), server)
    eds_pb2_grpc.add_EndpointDiscoveryServiceServicer_to_server(Eds(endpoints), server)
    bound = server.add_insecure_port(f"{host}:{port}")
    await server.start()
    write_ready(ready_file, {"grpc_port": bound, "grpc_ports": [bound]})
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(1.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.minimal_picker", description=__doc__)
    parser.add_argument("--endpoint", action="append", required=True, metavar="HOST:PORT")
    parser.add_argument("--listen-host", default="127.0.0.1")
    parser.add_argument("--grpc-port", type=int, default=9002, help="0: any free port")
    parser.add_argument("--ready-file", type=Path, help="write {grpc_port} here once serving")
    parser.add_argument("--no-uvloop", action="store_true", help="asyncio's own event loop")
    args = parser.parse_args(argv)
    if not args.no_uvloop:
        try:
            import uvloop

            uvloop.install()
        except ImportError:
            pass
    asyncio.run(serve(args.endpoint, args.listen_host, args.grpc_port, args.ready_file))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
