"""The request lifecycle's hooks: which observers the bus calls, in which order a
request meets the hooks through a real ext_proc stream, and per-request notes."""

from __future__ import annotations

import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

from epp.common.usage import Usage
from epp.config import build_scheduler
from epp.datastore import Datastore
from epp.extproc.stream import ExtProcStream
from epp.lifecycle.bus import Hooks
from epp.lifecycle.hooks import HOOKS, LifecycleObserver, Routing
from epp.types import Endpoint, InferenceRequest
from tests.support import extproc as m
from tests.support.routers import make_router

BODY = orjson.dumps({"model": "m", "prompt": "hello " * 20, "max_tokens": 4})
USAGE = b'{"usage": {"prompt_tokens": 30, "completion_tokens": 4}}'


class Recorder(LifecycleObserver):
    """Every hook, as (name, what it says)."""

    keeps_note = True

    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    def before_scheduling(self, request: InferenceRequest) -> None:
        self.events.append(("before_scheduling", request.model))

    def picked(self, routing: Routing) -> None:
        routing.notes[self.note_index] = "mine"
        self.events.append(("picked", routing.result.primary.address))

    def decode_picked(self, routing: Routing, moved: bool | None) -> None:
        self.events.append(("decode_picked", moved))

    def response_headers(self, address: str, headers: Mapping[str, str]) -> None:
        self.events.append(("response_headers", headers[":status"]))

    def first_byte(self, routing: Routing) -> None:
        assert routing.first_byte_at is not None
        self.events.append(("first_byte", routing.notes[self.note_index]))

    def response_chunk(self, routing: Routing, size: int) -> None:
        self.events.append(("response_chunk", size))

    def response_complete(
        self, routing: Routing, status: int, served: str, usage: Usage | None
    ) -> None:
        self.events.append(("response_complete", (status, usage and usage.prompt_tokens)))

    def ended(self, routing: Routing) -> None:
        self.events.append(("ended", routing.request.request_id != ""))

    def response_status(self, address: str, status: int, served: str) -> None:
        self.events.append(("response_status", status))

    def answered(self, routing: Routing, status: int, served: str) -> None:
        self.events.append(("answered", status))

    def rejected(self, status: int, request: InferenceRequest | None) -> None:
        self.events.append(("rejected", status))

    def stalled(self, address: str, served: str) -> None:
        self.events.append(("stalled", address))


class Counting:
    """An observer that does not subclass the Protocol: only what it defines is
    called."""

    def __init__(self) -> None:
        self.answers = 0

    def answered(self, routing: Routing, status: int, served: str) -> None:
        self.answers += 1


def recorded(*endpoints: Endpoint) -> tuple[ExtProcStream, Recorder]:
    ds = Datastore()
    for e in endpoints:
        ds.add(e)
    recorder = Recorder()
    router = make_router(ds, build_scheduler(""), rng=random.Random(0), observers=[recorder])
    return ExtProcStream(router), recorder


def test_the_bus_calls_only_the_hooks_an_observer_implements() -> None:
    class Silent(LifecycleObserver):
        """Implements nothing: on no hook."""

    recorder, counting, silent = Recorder(), Counting(), Silent()
    hooks = Hooks([silent, counting, recorder])
    for hook in HOOKS:
        implemented = getattr(hooks, hook)
        expected = [recorder] + ([counting] if hook == "answered" else [])
        assert [f.__self__ for f in implemented] == sorted(
            expected, key=[silent, counting, recorder].index
        ), hook
    assert hooks.note_count == 1 and recorder.note_index == 0
    assert Hooks([counting]).new_notes() == []  # no observer keeps one: nothing allocated


def test_a_request_meets_the_hooks_in_order_through_the_stream() -> None:
    stream, recorder = recorded(Endpoint("10.0.0.1", 8000))
    stream.on_message(m.request_headers())
    stream.on_message(m.request_body(BODY, True))
    stream.on_message(m.response_headers(200))
    stream.on_message(m.response_body(USAGE[:10], False))
    stream.on_message(m.response_body(USAGE[10:], True))
    stream.close()
    assert recorder.events == [
        ("before_scheduling", "m"),
        ("picked", "10.0.0.1:8000"),
        ("response_headers", "200"),
        ("first_byte", "mine"),
        ("response_chunk", 10),
        ("response_chunk", len(USAGE) - 10),
        ("response_complete", (200, 30)),
        ("ended", True),
        ("response_status", 200),
        ("answered", 200),
    ]


def test_a_refused_request_is_rejected_and_an_abandoned_one_ended() -> None:
    stream, recorder = recorded()  # no endpoint: 503
    stream.on_message(m.request_headers())
    [reply] = m.replies(stream.on_message(m.request_body(BODY, True)))
    assert reply.immediate_response.status.code == 503
    assert recorder.events == [("before_scheduling", "m"), ("rejected", 503)]

    stream, recorder = recorded(Endpoint("10.0.0.1", 8000))
    stream.on_message(m.request_headers())
    stream.on_message(m.request_body(BODY, True))
    stream.close("cancelled")  # the client left before the response
    assert [name for name, _ in recorder.events] == ["before_scheduling", "picked", "ended"]


def test_the_example_observer_in_extending_md_runs() -> None:
    text = (Path(__file__).parents[3] / "docs" / "extending.md").read_text()
    section = text[text.index("## Observe the request lifecycle") :]
    start = section.index("```python\n") + len("```python\n")
    code = section[start : section.index("\n```", start)]
    namespace: dict[str, Any] = {}
    exec(code, namespace)  # the documented example, as written
    slow = namespace["SlowFirstBytes"](bound_s=0.5)
    now = [100.0]
    ds = Datastore()
    ds.add(Endpoint("10.0.0.1", 8000))
    router = make_router(ds, build_scheduler(""), clock=lambda: now[0], observers=[slow])
    for delay in (0.1, 0.9):
        stream = ExtProcStream(router)
        stream.on_message(m.request_headers())
        stream.on_message(m.request_body(BODY, True))
        now[0] += delay
        stream.on_message(m.response_headers(200))
        stream.on_message(m.response_body(USAGE, True))
        stream.close()
    assert slow.slow == {"10.0.0.1:8000": 1}
