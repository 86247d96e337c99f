"""A KV pool shared by real ``epp sim`` processes through one directory: prefill
instances write their prompts' blocks, decode instances read what they lack."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from epp_harness.procs import ProcessFailed, spawn_epp
from tests.support.sim import SimProc, chat, completion, sims, sse_events


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, SimProc]]:
    workdir = tmp_path_factory.mktemp("pool")
    shared = ["--kv-connector", "pool", "--kv-pool-dir", str(workdir / "kv"), "--time-scale", "0"]
    names = ("prefill", "decode", "decode2", "both")
    roles = ("prefill", "decode", "decode", "prefill-decode")
    with sims(workdir, *(["--role", r, *shared] for r in roles)) as procs:
        yield dict(zip(names, procs, strict=True))


def fresh(tokens: int = 160) -> str:
    head = uuid.uuid4().hex
    return head + "k" * (tokens * 4 - len(head))


def served_as(sim: SimProc, path: str, doc: dict[str, object]) -> str:
    """Post ``doc``; which counter the request moved."""
    before = sim.stats()
    status, body = sim.post(path, doc)
    assert status == 200, body
    after = sim.stats()
    names = ("kv_transfers", "recomputed_prefills", "local_prefills", "prefill_legs")
    moved = [n for n in names if after[n] != before[n]]
    assert len(moved) == 1 and after[moved[0]] == before[moved[0]] + 1, (before, after)
    return moved[0]


def test_decode_finds_what_the_prefill_put_in_the_pool(fleet: dict[str, SimProc]) -> None:
    text = fresh()
    leg = chat(text, max_tokens=1)
    assert served_as(fleet["prefill"], "/v1/chat/completions", leg) == "prefill_legs"
    client = chat(text, max_tokens=4)
    assert served_as(fleet["decode"], "/v1/chat/completions", client) == "kv_transfers"
    # another process reads the same pool
    assert served_as(fleet["decode2"], "/v1/chat/completions", client) == "kv_transfers"
    # now cached locally: nothing left to fetch
    assert served_as(fleet["decode"], "/v1/chat/completions", client) == "local_prefills"


def test_streaming_decode_of_a_pooled_prefix_with_a_new_tail(fleet: dict[str, SimProc]) -> None:
    text = fresh()
    assert served_as(fleet["prefill"], "/v1/completions", completion(text, max_tokens=1)) == (
        "prefill_legs"
    )
    longer = completion(text + " and a question", max_tokens=3, stream=True)
    before = fleet["decode"].stats()
    status, body = fleet["decode"].post("/v1/completions", longer)
    assert status == 200 and sse_events(body)[-1] == "[DONE]"
    assert fleet["decode"].stats()["kv_transfers"] == before["kv_transfers"] + 1


def test_prompts_nobody_prefilled_are_local(fleet: dict[str, SimProc]) -> None:
    assert served_as(fleet["decode"], "/v1/completions", completion(fresh())) == "local_prefills"


def test_decode_instances_do_not_write_the_pool(fleet: dict[str, SimProc]) -> None:
    doc = completion(fresh(), max_tokens=2)
    assert served_as(fleet["decode"], "/v1/completions", doc) == "local_prefills"
    assert served_as(fleet["decode2"], "/v1/completions", doc) == "local_prefills"


def test_prefill_decode_instances_read_and_write(fleet: dict[str, SimProc]) -> None:
    doc = completion(fresh(), max_tokens=2)
    assert served_as(fleet["both"], "/v1/completions", doc) == "local_prefills"
    assert served_as(fleet["decode"], "/v1/completions", doc) == "kv_transfers"
    other = completion(fresh(), max_tokens=1)
    assert served_as(fleet["prefill"], "/v1/completions", other) == "prefill_legs"
    assert served_as(fleet["both"], "/v1/completions", other) == "kv_transfers"


def test_every_request_to_a_pool_prefill_is_a_leg(fleet: dict[str, SimProc]) -> None:
    """The EPP's pool leg is a plain one-token request: nothing else marks it."""
    doc = completion(fresh(), max_tokens=5)
    assert served_as(fleet["prefill"], "/v1/completions", doc) == "prefill_legs"
    stats = fleet["prefill"].stats()
    assert (stats["role"], stats["kv_connector"]) == ("prefill", "pool")


def test_pool_connector_needs_a_directory(tmp_path: Path) -> None:
    proc = spawn_epp(tmp_path, "no-dir", "sim", "--port", "0", "--kv-connector", "pool")
    try:
        with pytest.raises(ProcessFailed, match="exited with code 2"):
            proc.wait_ready()
        assert "--kv-pool-dir" in proc.log_tail()
    finally:
        proc.stop()
