"""The ext_proc phase table as plain data, then the real stream against it: every
phase x message either moves as the table says or gets the table's defined answer."""

from __future__ import annotations

import asyncio
import itertools
import json
import random
from pathlib import Path

import orjson
import pytest
from envoy.service.ext_proc.v3.external_processor_pb2 import HttpTrailers, ProcessingRequest
from hypothesis import given, settings
from hypothesis import strategies as st

from epp.config import build_scheduler
from epp.datastore import Datastore
from epp.extproc.phases import TABLE, Answer, Message, Outcome, Phase, message_of
from epp.extproc.stream import PROTOCOL_ERROR, ExtProcStream, Step
from epp.router import Router, StreamOptions
from epp.types import Endpoint
from epp.xds.eds import EnvoySync
from tests.support import extproc as m
from tests.support.routers import make_router as router_for

P, M = Phase, Message

# -- the table as plain data ----------------------------------------------------------
# Every legal move, written out once more by hand: the table must say exactly this.
RESPONSE_STARTS = {
    M.RESPONSE_HEADERS: P.RESPONSE_BODY,
    M.RESPONSE_HEADERS_END: P.DONE,
    M.RESPONSE_BODY: P.RESPONSE_BODY,
    M.RESPONSE_BODY_END: P.DONE,
    M.RESPONSE_TRAILERS: P.DONE,
}
LEGAL = {
    P.REQUEST_HEADERS: {
        M.REQUEST_HEADERS: P.REQUEST_BODY,
        M.REQUEST_HEADERS_END: P.ROUTING,
        **RESPONSE_STARTS,  # Envoy's own local reply, before the request reached us
    },
    P.REQUEST_BODY: {
        M.REQUEST_BODY: P.REQUEST_BODY,
        M.REQUEST_BODY_END: P.ROUTING,
        M.REQUEST_TRAILERS: P.ROUTING,
        **RESPONSE_STARTS,  # Envoy's own local reply while we hold the request
    },
    P.ROUTING: {},
    P.UPSTREAM: RESPONSE_STARTS,
    P.RESPONSE_BODY: {
        M.RESPONSE_BODY: P.RESPONSE_BODY,
        M.RESPONSE_BODY_END: P.DONE,
        M.RESPONSE_TRAILERS: P.DONE,
    },
    P.CUT: {},
    P.DONE: {},
}
# What else comes in DONE without being an error: Envoy sent it before our 413 reached it.
LATE = {M.REQUEST_BODY, M.REQUEST_BODY_END, M.REQUEST_TRAILERS}
# Where an illegal message can still be answered with a status the client sees.
BEFORE_RESPONSE = {P.REQUEST_HEADERS, P.REQUEST_BODY, P.ROUTING, P.UPSTREAM}


def expected(phase: Phase, message: Message) -> Phase | Answer:
    if message in LEGAL[phase]:
        return LEGAL[phase][message]
    if phase is P.DONE and message in LATE:
        return Answer.LATE
    if phase is P.CUT and message in RESPONSE_STARTS:  # the rest of a response we ended
        return Answer.LATE
    return Answer.REJECT if phase in BEFORE_RESPONSE else Answer.END_STREAM


def test_the_table_is_exactly_the_legal_moves_and_answers_everything_else() -> None:
    pairs = list(itertools.product(Phase, Message))
    assert len(pairs) == 7 * 11
    assert {pair: TABLE[pair] for pair in pairs} == {pair: expected(*pair) for pair in pairs}
    answers = [TABLE[pair] for pair in pairs]
    assert sum(isinstance(a, Phase) for a in answers) == 23
    assert (answers.count(Answer.LATE), answers.count(Answer.REJECT)) == (8, 24)
    assert answers.count(Answer.END_STREAM) == 22


def test_our_own_outcomes_move_only_where_they_can_happen() -> None:
    outcomes = {key: nxt for key, nxt in TABLE.items() if isinstance(key[1], Outcome)}
    assert outcomes == {
        (P.ROUTING, Outcome.ROUTED): P.UPSTREAM,
        (P.RESPONSE_BODY, Outcome.STALLED): P.CUT,
        **{(p, Outcome.REJECTED): P.DONE for p in Phase},
        **{(p, Outcome.CLOSED): P.DONE for p in Phase},
    }


def test_every_phase_is_reachable_and_done_is_the_end() -> None:
    seen, todo = {P.REQUEST_HEADERS}, [P.REQUEST_HEADERS]
    while todo:
        phase = todo.pop()
        for (here, _), nxt in TABLE.items():
            if here is phase and isinstance(nxt, Phase) and nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    assert seen == set(Phase)
    assert {nxt for (here, _), nxt in TABLE.items() if here is P.DONE} <= {P.DONE, *Answer}


# What Envoy sends in each processing mode (envoyconfig.py) and around local replies;
# ROUTED is our answer going out. Each walks the table to DONE without an answer.
ENVOY_SEQUENCES = {
    "full": [
        M.REQUEST_HEADERS, M.REQUEST_BODY, M.REQUEST_BODY_END, Outcome.ROUTED,
        M.RESPONSE_HEADERS, M.RESPONSE_BODY, M.RESPONSE_BODY_END,
    ],
    "full, request trailers": [
        M.REQUEST_HEADERS, M.REQUEST_BODY, M.REQUEST_TRAILERS, Outcome.ROUTED,
        M.RESPONSE_HEADERS, M.RESPONSE_BODY_END,
    ],
    "lean or buffered": [
        M.REQUEST_HEADERS, M.REQUEST_BODY_END, Outcome.ROUTED, M.RESPONSE_HEADERS,
        Outcome.CLOSED,
    ],
    "lean, response trailers": [
        M.REQUEST_HEADERS, M.REQUEST_BODY_END, Outcome.ROUTED, M.RESPONSE_HEADERS,
        M.RESPONSE_TRAILERS,
    ],
    "full, the server stalls mid-stream": [
        M.REQUEST_HEADERS, M.REQUEST_BODY_END, Outcome.ROUTED, M.RESPONSE_HEADERS,
        M.RESPONSE_BODY, Outcome.STALLED, M.RESPONSE_BODY, M.RESPONSE_BODY_END, Outcome.CLOSED,
    ],
    "no body": [M.REQUEST_HEADERS_END, Outcome.ROUTED, M.RESPONSE_HEADERS_END],
    "response_header_mode SKIP": [
        M.REQUEST_HEADERS_END, Outcome.ROUTED, M.RESPONSE_BODY, M.RESPONSE_BODY_END,
    ],
    "a local reply before the request reached us": [M.RESPONSE_HEADERS, M.RESPONSE_BODY_END],
    "a local reply while we hold the body": [
        M.REQUEST_HEADERS, M.REQUEST_BODY, M.RESPONSE_HEADERS_END,
    ],
    "rejected (413), the rest still coming": [
        M.REQUEST_HEADERS, M.REQUEST_BODY, Outcome.REJECTED, M.REQUEST_BODY,
        M.REQUEST_BODY_END,
    ],
    "the client hangs up": [M.REQUEST_HEADERS, M.REQUEST_BODY, Outcome.CLOSED],
}  # fmt: skip


@pytest.mark.parametrize("name", ENVOY_SEQUENCES)
def test_what_envoy_sends_walks_the_table_to_done(name: str) -> None:
    phase = P.REQUEST_HEADERS
    for event in ENVOY_SEQUENCES[name]:
        step = TABLE[phase, event]
        if step is Answer.LATE:
            continue
        assert isinstance(step, Phase), (phase, event, step)
        phase = step
    assert phase is P.DONE


# -- the real stream against the table ------------------------------------------------
BODY = orjson.dumps({"model": "m", "prompt": "hello " * 50, "max_tokens": 4})
LEAST_REQUEST = (Path(__file__).parents[4] / "configs" / "least-request.yaml").read_text()

# One message of each kind, as Envoy builds it.
SAMPLES: dict[Message, ProcessingRequest] = {
    M.REQUEST_HEADERS: m.request_headers(),
    M.REQUEST_HEADERS_END: m.request_headers(method="GET", path="/v1/models", end_of_stream=True),
    M.REQUEST_BODY: m.request_body(BODY[:7], False),
    M.REQUEST_BODY_END: m.request_body(BODY, True),
    M.REQUEST_TRAILERS: ProcessingRequest(request_trailers=HttpTrailers()),
    M.RESPONSE_HEADERS: m.response_headers(200),
    M.RESPONSE_HEADERS_END: m.response_headers(204, end_of_stream=True),
    M.RESPONSE_BODY: m.response_body(b'{"choices": [', False),
    M.RESPONSE_BODY_END: m.response_body(b"]}", True),
    M.RESPONSE_TRAILERS: ProcessingRequest(response_trailers=HttpTrailers()),
    M.UNKNOWN: ProcessingRequest(),
}
# How a stream gets into each phase (ROUTING: routing waits for an EDS acknowledgement).
PREFIXES = {
    P.REQUEST_HEADERS: [],
    P.REQUEST_BODY: [m.request_headers()],
    P.ROUTING: [m.request_headers(), m.request_body(BODY, True)],
    P.UPSTREAM: [m.request_headers(), m.request_body(BODY, True)],
    P.RESPONSE_BODY: [m.request_headers(), m.request_body(BODY, True), m.response_headers(200)],
    P.DONE: [
        m.request_headers(), m.request_body(BODY, True), m.response_headers(200),
        m.response_body(b"{}", True),
    ],
}  # fmt: skip


def make_router(sync: EnvoySync | None = None) -> Router:
    ds = Datastore()
    for port in (8000, 8001):
        ds.add(Endpoint("127.0.0.1", port))
    return router_for(
        ds, build_scheduler(LEAST_REQUEST), stream=StreamOptions(1 << 20, envoy_sync=sync),
        rng=random.Random(0),
    )  # fmt: skip


def test_every_sample_is_the_kind_it_stands_for() -> None:
    assert {kind: message_of(msg) for kind, msg in SAMPLES.items()} == {k: k for k in Message}


def rejected_500(router: Router) -> float:
    value: float = router.metrics.requests.labels("500")._value.get()
    return value


# CUT is reached by a stall only, not by a message (tests/unit/epp/extproc/test_stall.py)
@pytest.mark.parametrize(
    ("phase", "message"), list(itertools.product([p for p in Phase if p is not P.CUT], Message))
)
async def test_the_stream_does_what_the_table_says(phase: Phase, message: Message) -> None:
    # Routing waits (an Envoy behind EDS that has not acknowledged us) where a message
    # may lead into ROUTING, so the stream stays there and its phase can be read.
    sync = EnvoySync() if phase in (P.REQUEST_HEADERS, P.REQUEST_BODY, P.ROUTING) else None
    router = make_router(sync)
    stream = ExtProcStream(router, max_destinations=3)
    pending: list[Step] = []
    for msg in PREFIXES[phase]:
        out = stream.on_message(msg)
        assert not out.end_stream
        if out.wait is not None:
            pending.append(out)
    assert stream.phase is phase
    step = TABLE[phase, message]
    out = stream.on_message(SAMPLES[message])
    replies = list(out.replies)
    if isinstance(step, Phase):
        assert stream.phase is step
        assert not out.end_stream
        if out.wait is not None:
            pending.append(out)
        elif replies:
            assert not replies[0].HasField("immediate_response")
    elif step is Answer.LATE:
        assert m.replies(out) == [] and stream.phase is P.DONE
    elif step is Answer.REJECT:
        assert len(m.replies(out)) == 1
        answer = replies[0].immediate_response
        assert answer.status.code == 500
        error = json.loads(answer.body)["error"]
        assert error["code"] == PROTOCOL_ERROR and message.value in error["message"]
        assert stream.phase is P.DONE and rejected_500(router) == 1
    else:
        assert out == Step(end_stream=out.end_stream) and message.value in out.end_stream
        assert stream.phase is P.DONE and rejected_500(router) == 0
    if step in (Answer.REJECT, Answer.END_STREAM):  # released at once, not at the end
        assert router.datastore.total_in_flight() == 0
    stream.close()
    if sync is not None:
        sync.acknowledged()
    for waiting in pending:  # a stream closed while routing waited answers nothing
        late = await asyncio.wait_for(m.settle(stream, waiting), 5)
        assert not any(
            r.HasField("request_headers") or r.HasField("immediate_response") for r in late
        )
    assert router.datastore.total_in_flight() == 0


def test_envoys_own_local_reply_passes_through_before_any_request() -> None:
    """Another filter's 401 (or a codec error) reaches the ext_proc filter's response
    path although it never saw the request (envoyproxy/envoy#38261): passed through."""
    stream = ExtProcStream(make_router())
    [reply] = m.replies(stream.on_message(m.response_headers(401)))
    assert reply.HasField("response_headers")
    assert not reply.response_headers.HasField("response")
    [reply] = m.replies(stream.on_message(m.response_body(b"Jwt is missing", True)))
    assert reply.HasField("response_body") and stream.phase is P.DONE


def test_a_second_request_headers_neither_routes_again_nor_leaks_the_first_claim() -> None:
    router = make_router()
    stream = ExtProcStream(router)
    for msg in (m.request_headers(), m.request_body(BODY, True)):
        stream.on_message(msg)
    assert router.datastore.total_in_flight() == 1
    again = m.request_headers(method="GET", path="/v1/models", end_of_stream=True)
    [reply] = m.replies(stream.on_message(again))
    assert reply.immediate_response.status.code == 500
    assert router.datastore.total_in_flight() == 0
    stream.close()
    assert router.datastore.total_in_flight() == 0
    assert router.metrics.requests.labels("routed")._value.get() == 1


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(list(Message)), max_size=12))
def test_any_message_sequence_follows_the_table_and_releases_every_claim(
    kinds: list[Message],
) -> None:
    router = make_router()
    stream = ExtProcStream(router)
    for kind in kinds:
        before = stream.phase
        step = TABLE[before, kind]
        out = stream.on_message(SAMPLES[kind])
        assert all(n >= 0 for n in router.datastore.snapshot().in_flight.values())
        if out.end_stream:
            assert step is Answer.END_STREAM and not out.replies and out.wait is None
            break  # the driver ends the stream
        replies = m.replies(out)  # no EDS wait, no coordinator: never a wait
        if step is Answer.LATE:
            assert replies == []
        elif step is Answer.REJECT:
            assert [r.immediate_response.status.code for r in replies] == [500]
        else:
            assert isinstance(step, Phase)
            # the handler may still reject (e.g. a POST without a body): then DONE
            moved = {step, P.UPSTREAM} if step is P.ROUTING else {step}
            assert stream.phase in moved | {P.DONE}
        assert stream.phase is P.DONE or isinstance(step, Phase)
    stream.close()
    assert router.datastore.total_in_flight() == 0
