"""grpcio's own client (grpc.aio) against the native transport on the same event loop:
ext_proc streams and gRPC health, Check and Watch."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest
from envoy.service.ext_proc.v3.external_processor_pb2_grpc import ExternalProcessorStub
from grpc_health.v1 import health_pb2, health_pb2_grpc

from epp.extproc.native.server import NativeTransport
from epp.router import Router
from tests.support import extproc as m
from tests.support.native import BODY, serving
from tests.support.wait import until

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@pytest.fixture
async def served() -> AsyncIterator[tuple[NativeTransport, Router, grpc.aio.Channel]]:
    async with (
        serving() as (transport, router, port),
        grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel,
    ):
        yield transport, router, channel


async def test_ext_proc_stream(served: tuple[NativeTransport, Router, grpc.aio.Channel]) -> None:
    _, router, channel = served
    call = ExternalProcessorStub(channel).Process()
    await call.write(m.request_headers())
    for msg in m.chunked(BODY, 10, 100):
        await call.write(msg)
    head = await call.read()
    dest = m.set_headers(head)["x-gateway-destination-endpoint"]
    assert router.datastore.in_flight(dest) == 1
    body = [await call.read() for _ in range(1)]
    assert m.streamed_body(body) == (BODY, True)
    await call.done_writing()
    assert await call.read() == grpc.aio.EOF
    assert await call.code() == grpc.StatusCode.OK
    await until(lambda: router.datastore.total_in_flight() == 0, "released")


async def test_a_broken_protocol_is_failed_precondition(
    served: tuple[NativeTransport, Router, grpc.aio.Channel],
) -> None:
    _, router, channel = served
    call = ExternalProcessorStub(channel).Process()
    for msg in (m.request_headers(), m.request_body(BODY, True)):
        await call.write(msg)
    for _ in range(2):  # routed: headers, then the body echoed
        await call.read()
    await call.write(m.response_headers(200))
    await call.write(m.request_headers())  # no request may start once the response has
    with pytest.raises(grpc.aio.AioRpcError) as info:
        while await call.read() != grpc.aio.EOF:  # the status comes after the replies
            pass
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "request_headers is not allowed" in str(info.value.details())
    assert router.datastore.total_in_flight() == 0


async def test_health_check_and_watch(
    served: tuple[NativeTransport, Router, grpc.aio.Channel],
) -> None:
    transport, _, channel = served
    health = health_pb2_grpc.HealthStub(channel)
    reply = await health.Check(health_pb2.HealthCheckRequest(service="readiness"))
    assert reply.status == SERVING
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await health.Check(health_pb2.HealthCheckRequest(service="no-such-service"))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    watch = health.Watch(health_pb2.HealthCheckRequest(service="readiness"))
    assert (await watch.read()).status == SERVING
    await transport.set_serving(False, ["readiness"])
    assert (await watch.read()).status == NOT_SERVING
    await transport.set_serving(True, ["readiness"])
    assert (await watch.read()).status == SERVING
    unknown = health.Watch(health_pb2.HealthCheckRequest(service="later"))
    assert (await unknown.read()).status == health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
    watch.cancel()
    await until(lambda: transport.open_calls == 1, "the cancelled watch ended")
    await transport.stop(grace=600)  # a watch never ends by itself: stop ends it at once
    assert await unknown.read() == grpc.aio.EOF
    assert await unknown.code() == grpc.StatusCode.OK
