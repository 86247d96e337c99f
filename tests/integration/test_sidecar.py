"""`epp sidecar` between a client and a real decode simulator, with a real prefill
simulator: the NIXL flow, pass-through, and every way the prefill leg can go wrong."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from epp.procs import ManagedProcess, start_epp
from tests.support.http import get_json, request
from tests.support.sim import SimProc, completion, sims

LONG = "Context for the decode server. " * 80


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SimProc, SimProc, str]]:
    workdir: Path = tmp_path_factory.mktemp("sidecar")
    args = ["--time-scale", "0.05"]
    with sims(workdir, [*args, "--role", "prefill"], [*args, "--role", "decode"]) as (p, d):
        sidecar: ManagedProcess = start_epp(
            workdir, "sidecar", "sidecar", "--port", "0", "--decode", f"127.0.0.1:{d.port}"
        )
        try:
            yield p, d, f"http://127.0.0.1:{sidecar.info['port']}"
        finally:
            sidecar.stop()
        assert "Traceback" not in sidecar.log_tail(1000)


def post(url: str, doc: dict[str, Any], prefiller: str | None) -> tuple[int, bytes]:
    headers = {"x-request-id": "side-1"}
    if prefiller is not None:
        headers["x-prefiller-host-port"] = prefiller
    status, _, body = request(f"{url}/v1/completions", orjson.dumps(doc), headers)
    return status, body


def test_header_runs_prefill_then_decode_with_the_returned_params(
    pair: tuple[SimProc, SimProc, str],
) -> None:
    prefill, decode, url = pair
    before = decode.stats()
    status, body = post(
        url, completion("one: " + LONG, max_tokens=6, stream=True), f"127.0.0.1:{prefill.port}"
    )
    assert status == 200 and body.rstrip().endswith(b"data: [DONE]")
    after = decode.stats()
    assert after["kv_transfers"] == before["kv_transfers"] + 1
    assert after["recomputed_prefills"] == before["recomputed_prefills"]
    seen = get_json(f"{decode.url}/sim/last-request")
    assert seen["body"]["stream"] is True and seen["body"]["max_tokens"] == 6
    assert "x-prefiller-host-port" not in {k.lower() for k in seen["headers"]}


@pytest.mark.parametrize(
    "prefiller", [None, "not an address", "127.0.0.1:1"], ids=["absent", "malformed", "dead"]
)
def test_no_usable_prefiller_means_plain_decode(
    pair: tuple[SimProc, SimProc, str], prefiller: str | None
) -> None:
    _, decode, url = pair
    before = decode.stats()
    status, body = post(url, completion(f"{prefiller}: " + LONG, max_tokens=3), prefiller)
    assert status == 200, body[:200]
    after = decode.stats()
    assert after["local_prefills"] == before["local_prefills"] + 1
    assert after["kv_transfers"] == before["kv_transfers"]


def test_prefill_client_error_is_returned_as_is(pair: tuple[SimProc, SimProc, str]) -> None:
    prefill, _, url = pair
    status, body = post(url, {"model": "other", "prompt": LONG}, f"127.0.0.1:{prefill.port}")
    assert status == 404
    assert "other" in orjson.loads(body)["error"]["message"]
    stats = get_json(f"{url}/sidecar/stats")
    assert stats["rejected"] >= 1


def test_other_paths_pass_through(pair: tuple[SimProc, SimProc, str]) -> None:
    url = pair[2]
    status, _, body = request(f"{url}/metrics")
    assert status == 200 and b"vllm:num_requests_running" in body
    models = get_json(f"{url}/v1/models")
    assert models["data"][0]["id"] == "sim-model"


def test_allow_list_keeps_the_sidecar_from_calling_other_hosts(
    pair: tuple[SimProc, SimProc, str], tmp_path: Path
) -> None:
    prefill, decode, _ = pair
    guarded = start_epp(
        tmp_path, "guarded", "sidecar", "--port", "0", "--decode", f"127.0.0.1:{decode.port}",
        "--allow-prefiller", "10.0.0.0/8",
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{guarded.info['port']}"
        before = decode.stats()
        status, _ = post(
            url, completion("guarded: " + LONG, max_tokens=2), f"127.0.0.1:{prefill.port}"
        )
        assert status == 200
        assert get_json(f"{url}/sidecar/stats")["refused"] == 1
        after = decode.stats()
        assert after["local_prefills"] == before["local_prefills"] + 1
    finally:
        guarded.stop()
