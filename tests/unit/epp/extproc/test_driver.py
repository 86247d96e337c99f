"""The one driver both transports use, over an in-memory Channel (our own seam): what
it sends, the waits it performs while it keeps reading the stream, how it ends."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import orjson
import pytest
from envoy.extensions.filters.http.ext_proc.v3.processing_mode_pb2 import ProcessingMode
from envoy.service.ext_proc.v3.external_processor_pb2 import ProcessingRequest, ProcessingResponse

from epp.config import build_scheduler
from epp.datastore import Datastore
from epp.extproc.driver import StreamBroken, StreamEnd, drive
from epp.flowcontrol.queues import FlowControlConfig
from epp.observability.metrics import EppMetrics
from epp.router import Router, StreamOptions
from epp.types import Endpoint
from epp.xds.eds import EnvoySync
from tests.support import extproc as m
from tests.support.routers import make_router as make_lifecycle

LEAST_REQUEST = (Path(__file__).parents[4] / "configs" / "least-request.yaml").read_text()
BODY = orjson.dumps({"model": "m", "prompt": "hello " * 50, "max_tokens": 4})
STREAM_BODY = orjson.dumps({"model": "m", "prompt": "hello", "max_tokens": 4, "stream": True})
# A safety bound on a wait for an event, never what a test asserts.
SAFETY_S = 10


class Pipe:
    """An ext_proc stream in memory: the test puts Envoy's messages (None: a half-close;
    an exception: the stream failed) and reads the driver's replies."""

    def __init__(self) -> None:
        self.inbox: asyncio.Queue[ProcessingRequest | BaseException | None] = asyncio.Queue()
        self.outbox: asyncio.Queue[ProcessingResponse] = asyncio.Queue()
        self.reading = asyncio.Event()  # the driver waits in recv()
        self.taken = asyncio.Event()  # the driver took a message

    async def recv(self) -> ProcessingRequest | None:
        self.reading.set()
        item = await self.inbox.get()
        self.reading.clear()
        self.taken.set()
        if isinstance(item, BaseException):
            raise item
        return item

    async def send(self, reply: ProcessingResponse) -> None:
        self.outbox.put_nowait(reply)

    def put(self, *msgs: ProcessingRequest | BaseException | None) -> None:
        for msg in msgs:
            self.inbox.put_nowait(msg)

    async def reply(self) -> ProcessingResponse:
        return await asyncio.wait_for(self.outbox.get(), SAFETY_S)

    def sent(self) -> list[ProcessingResponse]:
        out = []
        while not self.outbox.empty():
            out.append(self.outbox.get_nowait())
        return out


def make_router(
    n: int = 2, flow: bool = False, config: str = LEAST_REQUEST, sync: EnvoySync | None = None
) -> Router:
    ds = Datastore()
    for i in range(n):
        ds.add(Endpoint("127.0.0.1", 8000 + i))
    metrics = EppMetrics(ds)
    return make_lifecycle(
        ds, build_scheduler(config), metrics, rng=random.Random(0),
        flow=FlowControlConfig(enabled=True) if flow else None,
        stream=StreamOptions(1 << 20, envoy_sync=sync),
    )  # fmt: skip


def ended(router: Router, end: StreamEnd) -> float:
    value: float = router.metrics.streams.labels(end)._value.get()
    return value


def open_streams(router: Router) -> float:
    value: float = router.metrics.open_streams._value.get()
    return value


async def test_a_request_and_its_response_pass_and_the_stream_ends_complete() -> None:
    router = make_router()
    pipe = Pipe()
    pipe.put(m.request_headers(), *m.chunked(BODY, 40))
    pipe.put(m.response_headers(200), m.response_body(b'{"usage": {}}', True), None)
    await asyncio.wait_for(drive(pipe, router), SAFETY_S)
    routed, *body, headers, response = pipe.sent()
    assert m.set_headers(routed)["x-gateway-destination-endpoint"].startswith("127.0.0.1:")
    assert m.streamed_body(body) == (BODY, True)
    assert headers.HasField("response_headers") and response.HasField("response_body")
    assert router.datastore.total_in_flight() == 0
    assert ended(router, "complete") == 1 and open_streams(router) == 0


@pytest.mark.parametrize(("eof", "counted"), [("complete", "abandoned"), ("ended", "abandoned")])
async def test_an_end_before_the_response_is_abandoned(eof: StreamEnd, counted: str) -> None:
    router = make_router()
    pipe = Pipe()
    pipe.put(m.request_headers(), m.request_body(BODY, True), None)
    await asyncio.wait_for(drive(pipe, router, eof=eof), SAFETY_S)
    assert pipe.sent()[0].HasField("request_headers")
    assert router.datastore.total_in_flight() == 0
    assert ended(router, counted) == 1  # type: ignore[arg-type]


async def test_eof_says_how_a_half_close_counts() -> None:
    router = make_router()
    pipe = Pipe()
    pipe.put(m.request_headers(method="GET", path="/v1/models", end_of_stream=True))
    pipe.put(m.response_headers(200, end_of_stream=True), None)
    await asyncio.wait_for(drive(pipe, router, eof="ended"), SAFETY_S)
    assert ended(router, "ended") == 1 and ended(router, "complete") == 0


async def test_a_message_that_breaks_the_protocol_after_the_response_started() -> None:
    router = make_router()
    pipe = Pipe()
    pipe.put(m.request_headers(), m.request_body(BODY, True), m.response_headers(200))
    pipe.put(m.request_headers())  # no request may start once the response has
    with pytest.raises(StreamBroken) as broken:
        await asyncio.wait_for(drive(pipe, router), SAFETY_S)
    assert "request_headers" in broken.value.reason and "RESPONSE_BODY" in broken.value.reason
    assert router.datastore.total_in_flight() == 0
    assert ended(router, "error") == 1 and open_streams(router) == 0


async def test_a_failing_stream_ends_as_error_and_a_cancelled_one_as_cancelled() -> None:
    router = make_router()
    pipe = Pipe()
    pipe.put(m.request_headers(), m.request_body(BODY, True), ConnectionResetError("reset"))
    with pytest.raises(ConnectionResetError):
        await asyncio.wait_for(drive(pipe, router), SAFETY_S)
    assert ended(router, "error") == 1 and router.datastore.total_in_flight() == 0

    pipe = Pipe()
    pipe.put(m.request_headers(), m.request_body(BODY, True))
    task = asyncio.ensure_future(drive(pipe, router))
    await pipe.reply()  # routed: the driver reads on
    await asyncio.wait_for(pipe.reading.wait(), SAFETY_S)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert ended(router, "cancelled") == 1 and router.datastore.total_in_flight() == 0
    assert open_streams(router) == 0


HOLD_ONE = "saturationDetector: {maxConcurrency: 1}"


async def one_routed_one_held(
    second: Pipe, headers: dict[str, str] | None = None
) -> tuple[Router, Pipe, asyncio.Future[None], asyncio.Future[None]]:
    """A pool with room for one request: a first request routed (it holds the room),
    then ``second``'s sent behind it. The router, the first pipe, both streams."""
    router = make_router(n=1, flow=True, config=HOLD_ONE)
    first = Pipe()
    first.put(m.request_headers(headers), m.request_body(BODY, True))
    running = asyncio.ensure_future(drive(first, router))
    assert (await first.reply()).HasField("request_headers")  # routed: it holds the room
    second.put(m.request_headers(headers), m.request_body(BODY, True))
    return router, first, running, asyncio.ensure_future(drive(second, router))


async def test_a_held_request_asks_envoy_to_wait_then_is_routed_when_room_frees() -> None:
    second = Pipe()
    priority = {"x-gateway-inference-priority": "2"}
    router, first, running, held = await one_routed_one_held(second, priority)
    extension = await second.reply()
    assert extension.HasField("override_message_timeout")  # Envoy is asked to wait
    first.put(m.response_headers(200, end_of_stream=True), None)  # room frees
    assert m.set_headers(await second.reply())["x-gateway-destination-endpoint"]
    second.put(m.response_headers(200, end_of_stream=True), None)
    await asyncio.wait_for(asyncio.gather(running, held), SAFETY_S)
    assert router.datastore.total_in_flight() == 0 and ended(router, "complete") == 2


async def test_a_client_that_leaves_while_held_cancels_the_wait_and_holds_nothing() -> None:
    second = Pipe()
    router, first, running, held = await one_routed_one_held(second)
    assert (await second.reply()).HasField("override_message_timeout")
    second.put(None)  # the client left: Envoy closes the stream
    await asyncio.wait_for(held, SAFETY_S)
    assert second.sent() == []  # no routing answer after the end
    assert len(router.flow.queues) == 0  # it left the queue
    assert ended(router, "abandoned") == 1
    first.put(m.response_headers(200, end_of_stream=True), None)
    await asyncio.wait_for(running, SAFETY_S)
    assert router.datastore.total_in_flight() == 0 and open_streams(router) == 0


class GonePipe(Pipe):
    """Envoy went away (killed) just as the request was held: asking it to wait fails,
    once ``fail`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.asking = asyncio.Event()  # the driver is sending the request to wait
        self.fail = asyncio.Event()

    async def send(self, reply: ProcessingResponse) -> None:
        if reply.HasField("override_message_timeout"):
            self.asking.set()
            await self.fail.wait()
            raise ConnectionResetError("Envoy is gone")
        await super().send(reply)


@pytest.mark.parametrize("routed_meanwhile", [False, True])
async def test_a_request_held_as_envoy_went_away_leaves_the_queue_and_holds_nothing(
    routed_meanwhile: bool,
) -> None:
    """The reply that asks Envoy to wait could not be sent, so the wait never began: the
    request must not stay in the queue to be routed once room frees, and a route it was
    given while the reply failed is given back (either would be an in-flight count
    nobody gives back: scenario seed 1167, Envoy restarted under flow control)."""
    second = GonePipe()
    router, first, running, held = await one_routed_one_held(second)
    await asyncio.wait_for(second.asking.wait(), SAFETY_S)
    if routed_meanwhile:  # room frees first: the held request is routed at once
        first.put(m.response_headers(200, end_of_stream=True), None)
        await asyncio.wait_for(running, SAFETY_S)
        assert router.datastore.total_in_flight() == 1 and len(router.flow.queues) == 0
    second.fail.set()
    with pytest.raises(ConnectionResetError):
        await asyncio.wait_for(held, SAFETY_S)
    assert len(router.flow.queues) == 0  # it left the queue
    if not routed_meanwhile:
        first.put(m.response_headers(200, end_of_stream=True), None)  # room frees
        await asyncio.wait_for(running, SAFETY_S)
    assert router.datastore.total_in_flight() == 0 and open_streams(router) == 0
    assert ended(router, "error") == 1 and ended(router, "complete") == 1


async def test_a_message_during_a_wait_is_answered_after_the_routing_replies() -> None:
    sync = EnvoySync()  # behind EDS, nothing is routed before Envoy acknowledged us
    router = make_router(sync=sync)
    pipe = Pipe()
    pipe.put(m.request_headers(), m.request_body(BODY[:30], False))
    task = asyncio.ensure_future(drive(pipe, router, max_destinations=3))
    pipe.put(m.request_body(BODY[30:], True))
    assert (await pipe.reply()).HasField("override_message_timeout")
    # a response message (Envoy's own local reply) arrives while routing waits
    pipe.taken.clear()
    pipe.put(m.response_headers(200, end_of_stream=True))
    await asyncio.wait_for(pipe.taken.wait(), SAFETY_S)  # taken while routing still waits
    assert not pipe.sent()  # nothing answered before the routing replies
    sync.acknowledged()
    routed = await pipe.reply()
    assert routed.HasField("request_headers")
    *body, headers = [await pipe.reply() for _ in range(2)]
    assert m.streamed_body(body) == (BODY, True) and headers.HasField("response_headers")
    pipe.put(None)
    await asyncio.wait_for(task, SAFETY_S)
    assert router.datastore.total_in_flight() == 0 and ended(router, "complete") == 1


async def test_a_stalled_response_is_ended_by_an_unsolicited_reply() -> None:
    router = make_router(n=1)
    router.stream_chunk_timeout_s = 0.05
    pipe = Pipe()
    full_duplex = ProcessingMode.FULL_DUPLEX_STREAMED
    pipe.put(m.request_headers(response_body_mode=full_duplex), m.request_body(STREAM_BODY, True))
    pipe.put(m.response_headers(200), m.response_body(b'data: {"choices": []}\n\n', False))
    task = asyncio.ensure_future(drive(pipe, router))
    for _ in range(4):  # routed, body, response headers, the chunk's echo
        await pipe.reply()
    end = await pipe.reply()  # no message asked for it: the chunk timeout did
    streamed = end.response_body.response.body_mutation.streamed_response
    assert streamed.end_of_stream and streamed.body.startswith(b"event: error\n")
    assert router.datastore.total_in_flight() == 0
    pipe.put(m.response_body(b"data: late\n\n", False), m.response_body(b"", True), None)
    await asyncio.wait_for(task, SAFETY_S)
    assert pipe.sent() == []  # what Envoy still sent of the response got no reply
    assert ended(router, "complete") == 1
