"""vLLM's NIXL pull flow between two real ``epp sim`` processes: the prefill leg (built
by the EPP's own ``nixl_prefill``) holds its blocks and names them in
``kv_transfer_params``; the decode leg pulls them over HTTP or, when it cannot,
recomputes the prefill and counts it."""

from __future__ import annotations

import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from epp.disagg.bodies import nixl_prefill
from tests.support.http import request
from tests.support.sim import SimProc, chat, completion, sims, sse_events
from tests.support.wait import wait_for

FAST = ["--time-scale", "1", "--decode-ms-per-token", "1", "--prefill-overhead-ms", "1"]
TTFT_SUM = "vllm:time_to_first_token_seconds_sum"


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SimProc, SimProc]]:
    with sims(
        tmp_path_factory.mktemp("nixl"),
        ["--role", "prefill", "--kv-connector", "nixl", *FAST],
        ["--role", "decode", "--kv-connector", "nixl", *FAST],
    ) as (prefill, decode):
        yield prefill, decode


def prompt(tokens: int = 200) -> str:
    """A prompt of exactly ``tokens`` simulated tokens no earlier test has cached."""
    head = uuid.uuid4().hex  # 32 characters: a prefix no other prompt shares
    return head + "x" * (tokens * 4 - len(head))


def run_prefill(prefill: SimProc, path: str, doc: dict[str, Any], rid: str) -> dict[str, Any]:
    """Post the prefill leg; the kv_transfer_params it returned."""
    status, body = prefill.post(path, nixl_prefill(doc), rid)
    assert status == 200, body
    params: dict[str, Any] = orjson.loads(body)["kv_transfer_params"]
    return params


def deltas(sim: SimProc, before: dict[str, Any]) -> dict[str, int]:
    after = sim.stats()
    names = ("kv_transfers", "recomputed_prefills", "local_prefills", "prefill_legs")
    return {n: after[n] - before[n] for n in names}


def test_prefill_leg_holds_its_blocks_and_names_them(pair: tuple[SimProc, SimProc]) -> None:
    prefill, _ = pair
    before = prefill.stats()
    status, body = prefill.post("/v1/completions", nixl_prefill(completion(prompt(200))))
    assert status == 200, body
    doc = orjson.loads(body)
    assert doc["usage"]["completion_tokens"] == 1 and len(doc["choices"][0]["text"]) == 4
    params = doc["kv_transfer_params"]
    assert params["do_remote_prefill"] is True and params["do_remote_decode"] is False
    assert params["remote_engine_id"] == before["engine_id"]
    assert (params["remote_host"], params["remote_port"]) == ("127.0.0.1", prefill.port)
    assert params["tp_size"] == 1
    blocks = params["remote_block_ids"]
    assert len(blocks) == 200 // 16 + 1 and len(set(blocks)) == len(blocks)
    stats = prefill.stats()
    assert stats["kv_blocks_held"] == before["kv_blocks_held"] + len(blocks)
    assert deltas(prefill, before)["prefill_legs"] == 1
    assert prefill.metric("vllm:kv_cache_usage_perc") > 0  # held blocks stay allocated


def test_decode_leg_pulls_and_streams_chat_without_recomputing(
    pair: tuple[SimProc, SimProc],
) -> None:
    prefill, decode = pair
    client = chat(prompt(300), max_tokens=5, stream=True, stream_options={"include_usage": True})
    params = run_prefill(prefill, "/v1/chat/completions", client, "rid-chat")
    held = prefill.stats()["kv_blocks_held"]
    before = decode.stats()
    status, body = decode.post(
        "/v1/chat/completions", {**client, "kv_transfer_params": params}, "rid-chat"
    )
    assert status == 200, body
    events = sse_events(body)
    assert events[-1] == "[DONE]" and events[-2]["usage"]["completion_tokens"] == 5
    assert len(events) == 1 + 5 + 1 + 1  # role delta, tokens, usage, [DONE]
    assert deltas(decode, before) == {
        "kv_transfers": 1, "recomputed_prefills": 0, "local_prefills": 0, "prefill_legs": 0,
    }  # fmt: skip
    # pulled blocks are freed at once
    assert prefill.stats()["kv_blocks_held"] == held - len(params["remote_block_ids"])
    seen = orjson.loads(request(f"{decode.url}/sim/last-request")[2])
    assert seen["body"]["stream"] is True and seen["body"]["max_tokens"] == 5
    assert seen["body"]["kv_transfer_params"] == params
    assert seen["headers"]["x-request-id"] == "rid-chat"


def test_transferred_prompt_reaches_its_first_token_sooner(
    pair: tuple[SimProc, SimProc],
) -> None:
    """Same-length prompts, one decode-only and one handed off: compare the decode's
    TTFT histogram sums. A prefill token (0.05 ms) costs 10 times a transferred one."""
    prefill, decode = pair
    before, ttft = decode.stats(), decode.metric(TTFT_SUM)
    status, _ = decode.post("/v1/completions", completion(prompt(2000), max_tokens=2))
    assert status == 200
    local_ttft = decode.metric(TTFT_SUM) - ttft
    assert deltas(decode, before)["local_prefills"] == 1

    client = completion(prompt(2000), max_tokens=2)
    params = run_prefill(prefill, "/v1/completions", client, "rid-ttft")
    ttft = decode.metric(TTFT_SUM)
    status, _ = decode.post("/v1/completions", {**client, "kv_transfer_params": params})
    assert status == 200
    handed_off_ttft = decode.metric(TTFT_SUM) - ttft
    assert handed_off_ttft < local_ttft / 2, (handed_off_ttft, local_ttft)


def decode_with(decode: SimProc, doc: dict[str, Any], params: Any) -> dict[str, int]:
    before = decode.stats()
    status, body = decode.post("/v1/completions", {**doc, "kv_transfer_params": params})
    assert status == 200, body  # a failed handoff never fails the request
    assert orjson.loads(body)["usage"]["completion_tokens"] == doc["max_tokens"]
    return deltas(decode, before)


RECOMPUTED = {"kv_transfers": 0, "recomputed_prefills": 1, "local_prefills": 0, "prefill_legs": 0}
TRANSFERRED = {"kv_transfers": 1, "recomputed_prefills": 0, "local_prefills": 0, "prefill_legs": 0}


def test_blocks_already_pulled_are_recomputed(pair: tuple[SimProc, SimProc]) -> None:
    prefill, decode = pair
    doc = completion(prompt(), max_tokens=3)
    params = run_prefill(prefill, "/v1/completions", doc, "rid-twice")
    assert decode_with(decode, doc, params) == TRANSFERRED
    assert decode_with(decode, doc, params) == RECOMPUTED


def test_unknown_engine_id_is_recomputed_and_leaves_the_blocks(
    pair: tuple[SimProc, SimProc],
) -> None:
    prefill, decode = pair
    doc = completion(prompt(), max_tokens=3)
    params = run_prefill(prefill, "/v1/completions", doc, "rid-engine")
    stale = {**params, "remote_engine_id": str(uuid.uuid4())}
    assert decode_with(decode, doc, stale) == RECOMPUTED
    assert decode_with(decode, doc, params) == TRANSFERRED  # still held for the right one


@pytest.mark.parametrize(
    "change",
    [
        {"remote_block_ids": None},
        {"remote_block_ids": []},
        {"remote_host": None},
        {"remote_port": "80"},
        {"remote_engine_id": None},
        {"do_remote_prefill": False},
    ],
    ids=lambda c: "-".join(f"{k}={v!r}" for k, v in c.items()),
)
def test_params_missing_a_field_are_recomputed(
    pair: tuple[SimProc, SimProc], change: dict[str, Any]
) -> None:
    prefill, decode = pair
    doc = completion(prompt(), max_tokens=2)
    params = run_prefill(prefill, "/v1/completions", doc, "rid-missing")
    assert decode_with(decode, doc, {**params, **change}) == RECOMPUTED


def test_unreachable_prefill_is_recomputed(pair: tuple[SimProc, SimProc]) -> None:
    _, decode = pair
    with socket.socket() as s:  # a port nobody listens on once closed
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    params = {
        "do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": "gone",
        "remote_block_ids": [1, 2], "remote_host": "127.0.0.1", "remote_port": closed,
    }  # fmt: skip
    assert decode_with(decode, completion(prompt(), max_tokens=2), params) == RECOMPUTED


def test_no_params_is_a_local_prefill_on_any_role(pair: tuple[SimProc, SimProc]) -> None:
    for sim in pair:
        before = sim.stats()
        status, _ = sim.post("/v1/completions", completion(prompt(), max_tokens=2))
        assert status == 200
        assert deltas(sim, before)["local_prefills"] == 1
        # null-only params ask for nothing either
        before = sim.stats()
        empty = dict.fromkeys(("remote_engine_id", "remote_host", "do_remote_prefill"))
        status, _ = sim.post(
            "/v1/completions", completion(prompt(), max_tokens=2, kv_transfer_params=empty)
        )
        assert status == 200 and deltas(sim, before)["local_prefills"] == 1


def test_blocks_expire_after_the_hold_time(tmp_path: Path) -> None:
    with sims(
        tmp_path,
        ["--role", "prefill", "--kv-hold-seconds", "0", "--time-scale", "0"],
        ["--role", "decode", "--time-scale", "0"],
    ) as (prefill, decode):
        doc = completion(prompt(), max_tokens=2)
        params = run_prefill(prefill, "/v1/completions", doc, "rid-expire")
        wait_for(lambda: prefill.stats()["kv_blocks_held"] == 0, what="the hold to expire")
        assert decode_with(decode, doc, params) == RECOMPUTED


def test_malformed_params_are_400_and_the_server_keeps_serving(
    pair: tuple[SimProc, SimProc],
) -> None:
    _, decode = pair
    status, body = decode.post("/v1/completions", completion("hi", kv_transfer_params="pull"))
    assert status == 400
    assert "kv_transfer_params" in orjson.loads(body)["error"]["message"]
    assert decode.post("/v1/completions", completion("hi"))[0] == 200


@pytest.mark.parametrize(
    ("doc", "status", "words"),
    [
        (b"not json", 400, "JSON object"),
        (b'{"engine_id": "", "block_ids": [1]}', 400, "engine_id"),
        (b'{"engine_id": "e", "block_ids": [true]}', 400, "block_ids"),
        (b'{"engine_id": "someone-else", "block_ids": [1]}', 404, "unknown engine id"),
    ],
)
def test_pull_route_answers_bad_pulls(
    pair: tuple[SimProc, SimProc], doc: bytes, status: int, words: str
) -> None:
    prefill, _ = pair
    got, _, body = request(f"{prefill.url}/sim/kv/pull", doc)
    assert got == status
    assert words in orjson.loads(body)["error"]["message"]


def test_pull_of_blocks_not_held_is_410(pair: tuple[SimProc, SimProc]) -> None:
    prefill, _ = pair
    doc = {"engine_id": prefill.stats()["engine_id"], "block_ids": [10**9]}
    got, _, body = request(f"{prefill.url}/sim/kv/pull", orjson.dumps(doc))
    assert got == 410 and "not held" in orjson.loads(body)["error"]["message"]


def test_counters_and_role_are_metrics_too(pair: tuple[SimProc, SimProc]) -> None:
    for sim, role in zip(pair, ("prefill", "decode"), strict=True):
        stats = sim.stats()
        assert (stats["role"], stats["kv_connector"]) == (role, "nixl")
        for name in ("kv_transfers", "recomputed_prefills", "local_prefills", "prefill_legs"):
            assert sim.metric(f"sim:{name}_total") == stats[name]
        _, _, text = request(f"{sim.url}/metrics")
        assert f'role="{role}"' in text.decode() and 'kv_connector="nixl"' in text.decode()
