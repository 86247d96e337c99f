"""`epp sidecar` between a client and a real decode simulator, with a real prefill
simulator: the NIXL flow, pass-through, and every way the prefill leg can go wrong."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web

from epp_harness.procs import ManagedProcess, epp_argv, start_epp
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


def test_an_unreachable_decode_server_ends_a_request_unanswered(tmp_path: Path) -> None:
    """A request Envoy would retry elsewhere: its connection ends before any answer (a
    502 is not retried); /metrics gets a 502 naming the decode server."""
    sidecar = start_epp(tmp_path, "orphan", "sidecar", "--port", "0", "--decode", "127.0.0.1:1")
    try:
        url = f"http://127.0.0.1:{sidecar.info['port']}"
        with pytest.raises(ConnectionResetError):  # http.client.RemoteDisconnected is one
            post(url, completion("nobody decodes this"), None)
        status, _, body = request(f"{url}/metrics")
        assert status == 502 and b"decode server 127.0.0.1:1 unreachable" in body
    finally:
        sidecar.stop()
    assert "closing the connection unanswered" in sidecar.log_tail(100)


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


def test_by_default_only_loopback_prefill_servers_are_called(
    pair: tuple[SimProc, SimProc, str],
) -> None:
    _, _, url = pair
    before = get_json(f"{url}/sidecar/stats")["refused"]
    status, _ = post(url, completion("elsewhere: " + LONG, max_tokens=2), "192.0.2.7:8000")
    assert status == 200  # decoded alone, without ever connecting to 192.0.2.7
    assert get_json(f"{url}/sidecar/stats")["refused"] == before + 1


def test_with_an_epp_only_its_prefill_members_are_called(
    pair: tuple[SimProc, SimProc, str], tmp_path: Path
) -> None:
    prefill, decode, _ = pair
    epp = start_epp(
        tmp_path, "epp", "serve", "--grpc-port", "0", "--http-port", "0", "--grpc-health-port", "0",
        "--prefill", f"localhost:{prefill.port}", "--decode", f"127.0.0.1:{decode.port}",
    )  # fmt: skip
    sidecar = start_epp(
        tmp_path, "checked", "sidecar", "--port", "0", "--decode", f"127.0.0.1:{decode.port}",
        "--epp-url", f"http://127.0.0.1:{epp.info['http_port']}",
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{sidecar.info['port']}"
        doc = completion("member: " + LONG, max_tokens=2)
        assert post(url, doc, f"127.0.0.1:{prefill.port}")[0] == 200
        # the decode server is on loopback but no prefill member of the EPP
        assert post(url, doc, f"127.0.0.1:{decode.port}")[0] == 200
        stats = get_json(f"{url}/sidecar/stats")
        assert (stats["prefill_legs"], stats["refused"]) == (1, 1), stats
    finally:
        sidecar.stop()
        epp.stop()


def test_bad_epp_url_is_a_usage_error(tmp_path: Path) -> None:
    result = subprocess.run(
        epp_argv("sidecar", "--decode", "127.0.0.1:1", "--epp-url", "grpc://epp:9090"),
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert result.returncode == 2
    assert "--epp-url: 'grpc://epp:9090': use http:// or https://, not grpc://" in result.stderr


async def test_a_client_closing_during_metrics_is_logged_as_such(tmp_path: Path) -> None:
    """A scraper that gives up while the sidecar relays a slow /metrics page: no ERROR
    traceback in the sidecar's log (an info line when the write fails; usually the
    handler is cancelled first and nothing is logged: the race is not forced here)."""
    done = asyncio.Event()

    async def slow_metrics(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        try:
            for _ in range(40):
                await response.write(b"# padding " + b"x" * 4000 + b"\n")
                await asyncio.sleep(0.02)
        except ConnectionResetError:
            pass  # the sidecar dropped us when its client went
        finally:
            done.set()
        return response

    app = web.Application()
    app.router.add_get("/metrics", slow_metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    upstream = runner.addresses[0][1]
    sidecar = start_epp(
        tmp_path, "relay", "sidecar", "--port", "0", "--decode", f"127.0.0.1:{upstream}"
    )
    try:
        for _ in range(3):
            done.clear()
            reader, writer = await asyncio.open_connection("127.0.0.1", sidecar.info["port"])
            writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            await reader.readexactly(2000)
            writer.close()  # gone, as a scraper that timed out
            await asyncio.wait_for(done.wait(), 10)
    finally:
        sidecar.stop()
        await runner.cleanup()
    log = sidecar.log_tail(1000)
    assert "Traceback" not in log and "ERROR" not in log, log


def test_a_dead_prefiller_passes_the_leg_to_the_next_one_named(
    pair: tuple[SimProc, SimProc, str],
) -> None:
    prefill, decode, url = pair
    before, stats_before = decode.stats(), get_json(f"{url}/sidecar/stats")
    headers = {
        "x-request-id": "side-failover",
        "x-prefiller-host-port": "127.0.0.1:1",
        "x-prefiller-fallbacks": f"not an address, 127.0.0.1:{prefill.port}",
    }
    doc = completion("failover: " + LONG, max_tokens=3)
    status, _, body = request(f"{url}/v1/completions", orjson.dumps(doc), headers)
    assert status == 200, body[:200]
    after, stats = decode.stats(), get_json(f"{url}/sidecar/stats")
    assert after["kv_transfers"] == before["kv_transfers"] + 1
    assert stats["failovers"] == stats_before["failovers"] + 2
    assert stats["prefill_legs"] == stats_before["prefill_legs"] + 1
    seen = get_json(f"{decode.url}/sim/last-request")
    assert "x-prefiller-fallbacks" not in {k.lower() for k in seen["headers"]}
