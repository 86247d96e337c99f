"""SGLang's bootstrap rendezvous (and its Mooncake backend) between real ``epp sim``
processes: the same body goes to a prefill and a decode instance at once and they meet
in ``bootstrap_room``; sent one after the other, both time out."""

from __future__ import annotations

import random
import socket
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import orjson
import pytest

from tests.support.http import request
from tests.support.sim import SimProc, chat, completion, sims, sse_events
from tests.support.wait import wait_for

TIMEOUT_S = 0.5
COMMON = ["--time-scale", "0", "--bootstrap-timeout-seconds", str(TIMEOUT_S)]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, SimProc]]:
    names = {
        "prefill": ["--role", "prefill", "--kv-connector", "sglang"],
        "decode": ["--role", "decode", "--kv-connector", "sglang"],
        "mc-prefill": ["--role", "prefill", "--kv-connector", "mooncake", "--bootstrap-port", "0"],
        "mc-decode": ["--role", "decode", "--kv-connector", "mooncake"],
        "both": ["--role", "both", "--kv-connector", "sglang"],
    }
    args = [[*a, *COMMON] for a in names.values()]
    with sims(tmp_path_factory.mktemp("rendezvous"), *args) as procs:
        yield dict(zip(names, procs, strict=True))


@pytest.fixture(scope="module")
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(4) as executor:
        yield executor


def with_room(doc: dict[str, Any], prefill: SimProc, port: int | None = None) -> dict[str, Any]:
    room = random.getrandbits(63)
    return {**doc, "bootstrap_host": "127.0.0.1", "bootstrap_port": port or prefill.port,
            "bootstrap_room": room}  # fmt: skip


def counts(sim: SimProc) -> dict[str, int]:
    s = sim.stats()
    names = ("kv_transfers", "recomputed_prefills", "local_prefills", "prefill_legs")
    return {n: s[n] for n in (*names, "bootstrap_failures")}


def grew(sim: SimProc, before: dict[str, int], **expected: int) -> None:
    after = counts(sim)
    assert {n: after[n] - before[n] for n in after} == {n: expected.get(n, 0) for n in after}


def error_message(body: bytes) -> str:
    message: str = orjson.loads(body)["error"]["message"]
    return message


@pytest.mark.parametrize(
    ("path", "doc"),
    [
        ("/v1/completions", completion("p" * 400, max_tokens=4, stream=True)),
        ("/v1/chat/completions", chat("c" * 400, max_tokens=4)),
    ],
    ids=["completions-stream", "chat"],
)
def test_concurrent_legs_meet_in_the_room(
    fleet: dict[str, SimProc], pool: ThreadPoolExecutor, path: str, doc: dict[str, Any]
) -> None:
    prefill, decode = fleet["prefill"], fleet["decode"]
    body = with_room(doc, prefill)
    p_before, d_before = counts(prefill), counts(decode)
    p_leg = pool.submit(prefill.post, path, body, "rid-room")
    d_leg = pool.submit(decode.post, path, body, "rid-room")
    (p_status, p_body), (d_status, d_body) = p_leg.result(), d_leg.result()
    assert (p_status, d_status) == (200, 200), (p_body, d_body)
    # the prefill side answers one token, not streamed, whatever the body asked
    assert orjson.loads(p_body)["usage"]["completion_tokens"] == 1
    if doc.get("stream"):
        events = sse_events(d_body)
        assert events[-1] == "[DONE]" and len(events) == 4 + 1
    else:
        assert orjson.loads(d_body)["usage"]["completion_tokens"] == 4
    grew(prefill, p_before, prefill_legs=1)
    grew(decode, d_before, kv_transfers=1)
    assert prefill.stats()["bootstrap_rooms"] == 0  # the room is gone once both left


@pytest.mark.parametrize("first", ["prefill", "decode"])
def test_either_leg_may_arrive_first(
    fleet: dict[str, SimProc], pool: ThreadPoolExecutor, first: str
) -> None:
    prefill = fleet["prefill"]
    body = with_room(completion("q" * 100, max_tokens=2), prefill)
    legs: dict[str, Future[tuple[int, bytes]]] = {}
    legs[first] = pool.submit(fleet[first].post, "/v1/completions", body)
    wait_for(lambda: prefill.stats()["bootstrap_rooms"] == 1, what="the first leg's room")
    second = "decode" if first == "prefill" else "prefill"
    legs[second] = pool.submit(fleet[second].post, "/v1/completions", body)
    assert legs["prefill"].result()[0] == 200 and legs["decode"].result()[0] == 200


def test_sequential_legs_deadlock_until_the_timeout(fleet: dict[str, SimProc]) -> None:
    """What a proxy that waits for the prefill's answer before sending the decode leg
    gets: the prefill waits for a decode that never joins, then the decode for a
    prefill that already left."""
    prefill, decode = fleet["prefill"], fleet["decode"]
    body = with_room(completion("s" * 200, max_tokens=3), prefill)
    p_before, d_before = counts(prefill), counts(decode)
    start = time.monotonic()
    status, p_body = prefill.post("/v1/completions", body)
    assert status == 504 and time.monotonic() - start >= TIMEOUT_S
    message = error_message(p_body)
    assert f"bootstrap room {body['bootstrap_room']}" in message
    assert "no decode instance joined within 0.5s" in message
    status, d_body = decode.post("/v1/completions", body)
    assert status == 504
    message = error_message(d_body)
    assert f"bootstrap room {body['bootstrap_room']}" in message
    assert "no prefill handed over KV within 0.5s" in message
    grew(prefill, p_before, bootstrap_failures=1)
    grew(decode, d_before, bootstrap_failures=1)
    # and both keep serving
    assert decode.post("/v1/completions", completion("after"))[0] == 200


def test_mismatched_rooms_time_out(fleet: dict[str, SimProc], pool: ThreadPoolExecutor) -> None:
    prefill, decode = fleet["prefill"], fleet["decode"]
    p_body = with_room(completion("m" * 200), prefill)
    d_body = with_room(completion("m" * 200), prefill)
    p_leg = pool.submit(prefill.post, "/v1/completions", p_body)
    d_leg = pool.submit(decode.post, "/v1/completions", d_body)
    (p_status, p_out), (d_status, d_out) = p_leg.result(), d_leg.result()
    assert (p_status, d_status) == (504, 504)
    assert str(p_body["bootstrap_room"]) in error_message(p_out)
    assert str(d_body["bootstrap_room"]) in error_message(d_out)


def test_mooncake_meets_on_a_separate_bootstrap_port(
    fleet: dict[str, SimProc], pool: ThreadPoolExecutor
) -> None:
    prefill, decode = fleet["mc-prefill"], fleet["mc-decode"]
    port = prefill.proc.info["bootstrap_port"]
    assert isinstance(port, int) and port not in (0, prefill.port)
    body = with_room(chat("mooncake " * 50, max_tokens=2), prefill, port)
    d_before = counts(decode)
    p_leg = pool.submit(prefill.post, "/v1/chat/completions", body)
    d_leg = pool.submit(decode.post, "/v1/chat/completions", body)
    assert p_leg.result()[0] == 200 and d_leg.result()[0] == 200
    grew(decode, d_before, kv_transfers=1)
    assert decode.stats()["kv_connector"] == "mooncake"
    # that port serves the rendezvous and nothing else
    assert request(f"http://127.0.0.1:{port}/v1/models")[0] == 404


def test_prefill_decode_role_ignores_bootstrap_fields(fleet: dict[str, SimProc]) -> None:
    both = fleet["both"]
    assert both.stats()["role"] == "prefill-decode"  # started as --role both
    before = counts(both)
    status, body = both.post("/v1/completions", with_room(completion("b", max_tokens=2), both))
    assert status == 200 and orjson.loads(body)["usage"]["completion_tokens"] == 2
    grew(both, before, local_prefills=1)


def test_plain_requests_are_local_prefills_on_both_sides(fleet: dict[str, SimProc]) -> None:
    for name in ("prefill", "decode"):
        before = counts(fleet[name])
        assert fleet[name].post("/v1/completions", completion("plain"))[0] == 200
        grew(fleet[name], before, local_prefills=1)


def test_unreachable_bootstrap_server_is_500_naming_the_room(fleet: dict[str, SimProc]) -> None:
    decode = fleet["decode"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    body = {**completion("u"), "bootstrap_host": "127.0.0.1", "bootstrap_port": closed,
            "bootstrap_room": 7}  # fmt: skip
    status, out = decode.post("/v1/completions", body)
    assert status == 500
    assert "bootstrap room 7: cannot reach the bootstrap server" in error_message(out)


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"bootstrap_room": -1}, "bootstrap_room"),
        ({"bootstrap_room": 2**63}, "bootstrap_room"),
        ({"bootstrap_room": "1"}, "bootstrap_room"),
        ({"bootstrap_room": 1, "bootstrap_port": 1}, "bootstrap_host"),
        ({"bootstrap_room": 1, "bootstrap_host": "h", "bootstrap_port": 0}, "bootstrap_port"),
    ],
)
def test_malformed_bootstrap_fields_are_400(
    fleet: dict[str, SimProc], fields: dict[str, Any], words: str
) -> None:
    for name in ("prefill", "decode"):
        status, body = fleet[name].post("/v1/completions", {**completion("x"), **fields})
        assert status == 400 and words in error_message(body)


@pytest.mark.parametrize(
    ("sim", "doc", "status", "words"),
    [
        ("decode", b'{"room": 1}', 404, "no bootstrap rendezvous here"),
        ("prefill", b"[]", 400, "JSON object"),
        ("prefill", b'{"room": -3}', 400, "room"),
        ("prefill", b'{"room": 3, "timeout_seconds": -1}', 400, "timeout_seconds"),
    ],
)
def test_join_route_answers_bad_joins(
    fleet: dict[str, SimProc], sim: str, doc: bytes, status: int, words: str
) -> None:
    got, _, body = request(f"{fleet[sim].url}/sim/bootstrap/join", doc)
    assert got == status and words in error_message(body)


def test_a_room_takes_one_decode(fleet: dict[str, SimProc], pool: ThreadPoolExecutor) -> None:
    prefill = fleet["prefill"]
    join = orjson.dumps({"room": 99, "timeout_seconds": 5})
    first = pool.submit(request, f"{prefill.url}/sim/bootstrap/join", join)
    wait_for(lambda: prefill.stats()["bootstrap_rooms"] == 1, what="the first join")
    got, _, body = request(f"{prefill.url}/sim/bootstrap/join", join)
    assert got == 409 and "already joined" in error_message(body)
    # a prefill leg for room 99 now meets the first decode
    status, _ = prefill.post("/v1/completions", {**with_room(completion("r"), prefill),
                                                 "bootstrap_room": 99})  # fmt: skip
    assert status == 200
    assert first.result()[0] == 200 and orjson.loads(first.result()[2])["tokens"] == 1
