"""The request lifecycle's hooks: which observers the bus calls, in which order a
request meets the hooks through a real ext_proc stream (its exchange, its wait in flow
control, its prefill leg), the headers observers add, and per-request notes."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import orjson
import pytest

from epp.common.usage import Usage
from epp.config import build_scheduler
from epp.datastore import Datastore
from epp.disagg.coordinators import DecodeLeg, Handoff
from epp.errors import ClientVisibleError, PrefillRejectedError
from epp.extproc.stream import ExtProcStream
from epp.flowcontrol.queues import FlowControlConfig
from epp.lifecycle.bus import Hooks
from epp.lifecycle.hooks import HOOKS, Exchange, LifecycleObserver, Routing
from epp.router import Router
from epp.types import Endpoint, InferenceRequest, Role
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

    def add_headers(self, routing: Routing, prefill: Endpoint | None) -> Iterable[tuple[str, str]]:
        self.events.append(("add_headers", None if prefill is None else prefill.address))
        return [("x-recorded", "decode" if prefill is None else "prefill")]

    def prefill_done(self, routing: Routing, error: str | None, decode: Endpoint | None) -> None:
        self.events.append(("prefill_done", (error, None if decode is None else decode.address)))

    def started(self, exchange: Exchange) -> None:
        self.events.append(("started", exchange.headers[":path"]))

    def admitting(self, exchange: Exchange, request: InferenceRequest) -> None:
        self.events.append(("admitting", request.model))

    def held(self, exchange: Exchange, request: InferenceRequest) -> None:
        self.events.append(("held", request.model))

    def admitted(self, exchange: Exchange, routing: Routing, priority: int) -> None:
        self.events.append(("admitted", priority))

    def closed(self, exchange: Exchange, status: int, outcome: str) -> None:
        # the note the routing got is the exchange's
        note = exchange.notes[self.note_index]
        self.events.append(("closed", (status, outcome, exchange.refused, note)))


class Counting:
    """An observer that does not subclass the Protocol: only what it defines is
    called."""

    def __init__(self) -> None:
        self.answers = 0

    def answered(self, routing: Routing, status: int, served: str) -> None:
        self.answers += 1


def recorded(*endpoints: Endpoint) -> tuple[ExtProcStream, Recorder]:
    router, recorder = recording(*endpoints)
    return ExtProcStream(router), recorder


def recording(
    *endpoints: Endpoint, config: str = "", coordinator: Any = None
) -> tuple[Router, Recorder]:
    ds = Datastore()
    for e in endpoints:
        ds.add(e)
    recorder = Recorder()
    router = make_router(
        ds, build_scheduler(config), rng=random.Random(0), observers=[recorder],
        coordinator=coordinator, flow=FlowControlConfig(enabled=True),
    )  # fmt: skip
    return router, recorder


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
    assert hooks.exchanges and not Hooks([counting, silent]).exchanges


def test_without_an_exchange_observer_a_request_opens_no_exchange() -> None:
    """The built-in observers follow no exchange: the stream opens none, and the hooks
    only an exchange or a header-adding observer needs are empty tuples."""
    ds = Datastore()
    ds.add(Endpoint("10.0.0.1", 8000))
    hooks = make_router(ds, build_scheduler("")).hooks
    assert not hooks.exchanges
    assert hooks.add_headers == () and hooks.prefill_done == ()


def test_a_request_meets_the_hooks_in_order_through_the_stream() -> None:
    stream, recorder = recorded(Endpoint("10.0.0.1", 8000))
    stream.on_message(m.request_headers())
    routed = m.replies(stream.on_message(m.request_body(BODY, True)))
    assert m.set_headers(routed[0])["x-recorded"] == "decode"  # an observer's header
    stream.on_message(m.response_headers(200))
    stream.on_message(m.response_body(USAGE[:10], False))
    stream.on_message(m.response_body(USAGE[10:], True))
    stream.close()
    assert recorder.events == [
        ("started", "/v1/completions"),
        ("admitting", "m"),
        ("before_scheduling", "m"),
        ("picked", "10.0.0.1:8000"),
        ("admitted", 0),
        ("add_headers", None),
        ("response_headers", "200"),
        ("first_byte", "mine"),
        ("response_chunk", 10),
        ("response_chunk", len(USAGE) - 10),
        ("response_complete", (200, 30)),
        ("ended", True),
        ("response_status", 200),
        ("answered", 200),
        ("closed", (200, "complete", None, "mine")),
    ]


def test_a_refused_request_is_rejected_and_an_abandoned_one_ended() -> None:
    stream, recorder = recorded()  # no endpoint: 503
    stream.on_message(m.request_headers())
    [reply] = m.replies(stream.on_message(m.request_body(BODY, True)))
    assert reply.immediate_response.status.code == 503
    stream.close()
    refused = (503, "no_endpoint")
    assert recorder.events[1:] == [
        ("admitting", "m"),
        ("before_scheduling", "m"),
        ("rejected", 503),
        ("closed", (0, "complete", refused, None)),
    ]

    stream, recorder = recorded()
    stream.on_message(m.request_headers())
    stream.on_message(m.request_body(b"{bad", True))  # refused before admission
    stream.close()
    assert [name for name, _ in recorder.events] == ["started", "rejected", "closed"]
    assert recorder.events[-1][1][2] == (400, "invalid_json")

    stream, recorder = recorded(Endpoint("10.0.0.1", 8000))
    stream.on_message(m.request_headers())
    stream.on_message(m.request_body(BODY, True))
    stream.close("cancelled")  # the client left before the response
    assert [name for name, _ in recorder.events] == [
        "started",
        "admitting",
        "before_scheduling",
        "picked",
        "admitted",
        "add_headers",
        "ended",
        "closed",
    ]
    assert recorder.events[-1][1][:2] == (0, "cancelled")


async def test_a_held_request_is_held_between_admitting_and_its_pick() -> None:
    router, recorder = recording(
        Endpoint("10.0.0.1", 8000), config="saturationDetector: {maxConcurrency: 1}"
    )
    first, second = ExtProcStream(router), ExtProcStream(router)
    for stream in (first, second):
        stream.on_message(m.request_headers({"x-gateway-inference-priority": "2"}))
    assert m.replies(first.on_message(m.request_body(BODY, True)))
    recorder.events.clear()
    held = second.on_message(m.request_body(BODY, True))
    assert held.wait is not None
    assert recorder.events == [("admitting", "m"), ("held", "m")]
    task = asyncio.ensure_future(m.settle(second, held))
    first.close()  # room frees: the second is dispatched
    replies = await asyncio.wait_for(task, 2)
    assert m.set_headers(replies[0])["x-recorded"] == "decode"
    second.close()
    names = [name for name, _ in recorder.events]
    dispatched = names[names.index("closed") + 1 :]  # once the first one's stream ended
    assert dispatched[:4] == ["before_scheduling", "picked", "admitted", "add_headers"]
    assert ("admitted", 2) in recorder.events


class Leg:
    """A P/D coordinator that runs no leg: it answers the decode leg at once
    (``at_once``, as a sidecar's hand-off does), or once the test sets ``release``,
    failing with ``error`` when one is given."""

    name = "leg"
    defers = False

    def __init__(self, at_once: bool = False, error: ClientVisibleError | None = None) -> None:
        self.at_once = at_once
        self.error = error
        self.release = asyncio.Event()
        self.handoffs: list[Handoff] = []

    def hand_off(self, handoff: Handoff) -> DecodeLeg | Any:
        self.handoffs.append(handoff)
        return DecodeLeg() if self.at_once else self._leg()

    async def _leg(self) -> DecodeLeg:
        await self.release.wait()
        if self.error is not None:
            raise self.error
        return DecodeLeg()

    async def close(self) -> None:
        pass


LONG = orjson.dumps({"model": "m", "prompt": "a long prompt " * 200, "max_tokens": 5})
PREFILL, DECODE = Endpoint("10.0.0.1", 8000, Role.PREFILL), Endpoint("10.0.0.2", 8000)


@pytest.mark.parametrize(
    ("at_once", "error", "done", "status"),
    [
        (True, None, (None, None), 0),  # no leg ran in the EPP: no decode endpoint told
        (False, None, (None, DECODE.address), 0),
        (False, "prefill said no", ("prefill said no", None), 422),
    ],
    ids=["at-once", "awaited", "failed"],
)
async def test_a_prefill_leg_carries_the_observers_headers_and_its_end_is_told(
    at_once: bool, error: str | None, done: tuple[str | None, str | None], status: int
) -> None:
    failure = None if error is None else PrefillRejectedError(422, b"", error)
    coordinator = Leg(at_once, failure)
    router, recorder = recording(PREFILL, DECODE, coordinator=coordinator)
    stream = ExtProcStream(router)
    stream.on_message(m.request_headers())
    step = stream.on_message(m.request_body(LONG, True))
    coordinator.release.set()
    replies = await asyncio.wait_for(m.settle(stream, step), 2)
    stream.close()
    (handoff,) = coordinator.handoffs
    assert handoff.request.headers["x-recorded"] == "prefill"  # the prefill leg's request
    names = [name for name, _ in recorder.events]
    assert names.index("admitted") < names.index("add_headers") < names.index("prefill_done")
    assert ("add_headers", PREFILL.address) in recorder.events
    assert ("prefill_done", done) in recorder.events
    if status:
        assert replies[0].immediate_response.status.code == status
    else:  # the decode leg's headers are asked for after the prefill leg's
        assert m.set_headers(replies[0])["x-recorded"] == "decode"
        assert names.index("prefill_done") < len(names) - 1 - names[::-1].index("add_headers")


def documented(example: int) -> dict[str, Any]:
    """The namespace of docs/extending.md's ``example``-th observer, run as written."""
    text = (Path(__file__).parents[3] / "docs" / "extending.md").read_text()
    section = text[text.index("## Observe the request lifecycle") :]
    start = -1
    for _ in range(example + 1):
        start = section.index("```python\n", start + 1)
    start += len("```python\n")
    code = section[start : section.index("\n```", start)]
    namespace: dict[str, Any] = {}
    exec(code, namespace)
    return namespace


def test_the_example_observer_in_extending_md_runs() -> None:
    namespace = documented(0)
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


def test_the_header_adding_example_in_extending_md_sets_its_header() -> None:
    picked = documented(1)["PickedHeader"]()
    ds = Datastore()
    ds.add(Endpoint("10.0.0.1", 8000))
    router = make_router(ds, build_scheduler(""), observers=[picked])
    assert not router.hooks.exchanges  # it follows no exchange: none is opened
    stream = ExtProcStream(router)
    stream.on_message(m.request_headers({"x-epp-picked": "from the client"}))
    [reply, *_] = m.replies(stream.on_message(m.request_body(BODY, True)))
    assert m.set_headers(reply)["x-epp-picked"] == "10.0.0.1:8000"
    stream.close()
