"""The between-chunk watchdog on a fake clock, the error event, and a stream that stalls."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import orjson
import pytest
from envoy.extensions.filters.http.ext_proc.v3.processing_mode_pb2 import ProcessingMode
from envoy.service.ext_proc.v3.external_processor_pb2 import ProcessingResponse

from epp.datalayer.ejection import EjectionPolicy, Ejector
from epp.datastore import Status
from epp.extproc.phases import Phase
from epp.extproc.stall import STALL_CODE, ChunkWatch, stall_event
from epp.extproc.stream import ExtProcStream
from tests.support import extproc as m
from tests.unit.epp.extproc.test_stream import BODY, make_router, run


class FakeTimers:
    """A clock that moves only when told, and the timers due by then."""

    def __init__(self) -> None:
        self.now = 100.0
        self.timers: list[tuple[float, Callable[[], object], FakeHandle]] = []
        self.armed = 0  # call_at calls

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Callable[[], object], /) -> FakeHandle:
        handle = FakeHandle()
        self.timers.append((when, callback, handle))
        self.armed += 1
        return handle

    def advance(self, seconds: float) -> None:
        self.now += seconds
        while due := [t for t in self.timers if t[0] <= self.now]:
            for timer in due:
                self.timers.remove(timer)
                if not timer[2].cancelled:
                    timer[1]()


class FakeHandle:
    cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


def test_it_fires_once_the_timeout_after_the_last_chunk() -> None:
    timers, stalls = FakeTimers(), []
    watch = ChunkWatch(timers, 2.0, lambda: stalls.append(timers.now))
    for _ in range(10):  # chunks every 0.5 s
        timers.advance(0.5)
        watch.chunk()
    last = timers.now
    timers.advance(1.9)
    assert stalls == []
    timers.advance(0.2)
    assert stalls == [pytest.approx(last + 2.1)]  # the fake fires timers when it is told
    timers.advance(10)
    assert len(stalls) == 1


def test_chunks_do_not_touch_the_timer() -> None:
    timers, stalls = FakeTimers(), []
    watch = ChunkWatch(timers, 2.0, lambda: stalls.append(1))
    for _ in range(1000):  # 10 s of chunks every 10 ms
        timers.advance(0.01)
        watch.chunk()
    # re-armed only when it fires, for the newest chunk's deadline: every 2 s, not
    # at every chunk
    assert timers.armed <= 1 + 10 / 2 and stalls == []


def test_stopped_it_never_fires() -> None:
    timers, stalls = FakeTimers(), []
    watch = ChunkWatch(timers, 1.0, lambda: stalls.append(1))
    watch.stop()
    watch.stop()
    timers.advance(5)
    assert stalls == []


def test_the_error_event_is_an_sse_event_of_its_own() -> None:
    event = stall_event(15, b'data: {"choices": []}\n\n')
    assert event.startswith(b"event: error\ndata: ") and event.endswith(b"\n\n")
    error = orjson.loads(event.split(b"data: ", 1)[1])["error"]
    assert error == {
        "message": "the model server sent nothing for 15 s; the stream was ended",
        "type": "timeout",
        "code": STALL_CODE,
    }
    # a half-sent event is ended first, so the error is not glued to it
    assert stall_event(15, b'data: {"choi').startswith(b"\n\nevent: error\n")
    anthropic = orjson.loads(stall_event(1, b"", anthropic=True).split(b"data: ", 1)[1])
    assert anthropic["type"] == "error" and anthropic["error"]["type"] == "timeout_error"


STREAM_BODY = orjson.dumps({"model": "m", "prompt": "hello", "max_tokens": 4, "stream": True})


async def test_a_stalled_stream_is_ended_released_and_counted() -> None:
    router = make_router(n=1)
    router.stream_chunk_timeout_s = 0.05
    ejector = Ejector(router.datastore, EjectionPolicy(eject_after=1), probe=_never)
    router.outcomes = ejector
    sent: asyncio.Queue[ProcessingResponse] = asyncio.Queue()
    stream = ExtProcStream(router, timers=asyncio.get_running_loop(), push=sent.put_nowait)
    full_duplex = ProcessingMode.FULL_DUPLEX_STREAMED
    stream.on_message(m.request_headers(response_body_mode=full_duplex))
    run(stream, m.chunked(STREAM_BODY))
    stream.on_message(m.response_headers(200))
    stream.on_message(m.response_body(b'data: {"choices": []}\n\n', False))
    assert router.datastore.total_in_flight() == 1

    reply = await asyncio.wait_for(sent.get(), 10)  # a safety bound, not the assertion
    streamed = reply.response_body.response.body_mutation.streamed_response
    assert streamed.end_of_stream and streamed.body.startswith(b"event: error\n")
    assert stream.phase is Phase.CUT
    assert router.datastore.total_in_flight() == 0
    assert router.metrics.stream_stalls._value.get() == 1
    member = router.datastore.member("127.0.0.1:8000")
    assert member is not None and member.status is Status.EJECTED  # one stall, eject_after=1
    # what Envoy still sends of the response gets no reply; the stream ends cleanly
    assert m.replies(stream.on_message(m.response_body(b"data: late\n\n", False))) == []
    assert m.replies(stream.on_message(m.response_body(b"", True))) == []
    stream.close()
    assert router.metrics.streams.labels("complete")._value.get() == 1
    assert sent.empty()


async def test_without_full_duplex_or_stream_nothing_is_watched() -> None:
    router = make_router(n=1)
    router.stream_chunk_timeout_s = 0.01

    def push(reply: ProcessingResponse) -> None:
        raise AssertionError("nothing to send")

    for body, mode in ((STREAM_BODY, ProcessingMode.STREAMED), (BODY, None)):
        stream = ExtProcStream(router, timers=asyncio.get_running_loop(), push=push)
        stream.on_message(m.request_headers(response_body_mode=mode))
        run(stream, m.chunked(body))
        stream.on_message(m.response_headers(200))
        stream.on_message(m.response_body(b"data: x\n\n", False))
        assert stream._watch is None
        stream.close()


async def _never(address: str) -> str | None:
    return "not probed in this test"
