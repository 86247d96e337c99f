"""The simulator's ORCA response headers, read back with the EPP's own parser: asked for
per request (``endpoint-load-metrics-format``) or always on (``--orca-format``), only on
non-streaming responses, carrying the engine's live state."""

from __future__ import annotations

import argparse
import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from epp.datalayer.orca import parse_orca
from epp_harness.procs import ManagedProcess, spawn_epp
from epp_harness.sim.flags import add_arguments
from tests.support.http import get_json, open_raw_post, request
from tests.support.wait import wait_for

NAMED = {
    "named_metrics.kv_cache_usage_perc",
    "named_metrics.num_requests_waiting",
    "named_metrics.num_requests_running",
}
PREFIX = {"text": "TEXT ", "json": "JSON ", "bin": "BIN "}


@pytest.fixture(scope="module")
def sims(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ManagedProcess]]:
    """One simulator per --orca-format (started in parallel); "none" runs in real time
    with a small KV cache so a running request shows up in the load it reports."""
    workdir = tmp_path_factory.mktemp("sim-orca")
    procs: dict[str, ManagedProcess] = {}
    try:
        procs["none"] = spawn_epp(
            workdir, "sim-none", "sim", "--port", "0", "--kv-blocks", "100", "--max-num-seqs", "4"
        )
        for fmt in ("text", "json", "bin"):
            procs[fmt] = spawn_epp(
                workdir, f"sim-{fmt}", "sim", "--port", "0", "--time-scale", "0",
                "--orca-format", fmt.upper() if fmt == "json" else fmt,
            )  # fmt: skip
        for proc in procs.values():
            proc.wait_ready()
        yield procs
    finally:
        for proc in procs.values():
            assert proc.stop() == 0
            assert "Traceback" not in proc.log_tail(500)


def post(
    proc: ManagedProcess,
    *,
    stream: bool = False,
    fmt: str | None = None,
    path: str = "/v1/completions",
) -> dict[str, str]:
    body: dict[str, object] = {"model": "sim-model", "max_tokens": 2, "stream": stream}
    if path.endswith("chat/completions"):
        body["messages"] = [{"role": "user", "content": "hello"}]
    else:
        body["prompt"] = "hello"
    headers = {} if fmt is None else {"endpoint-load-metrics-format": fmt}
    status, resp_headers, data = request(
        proc.info["url"] + path, json.dumps(body).encode(), headers
    )
    assert status == 200, data
    if stream:
        assert data.rstrip().endswith(b"data: [DONE]")
    return resp_headers


@pytest.mark.parametrize("fmt", ["TEXT", "text", "JSON", "Json", "BIN", "bin"])
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_request_header_asks_for_orca(sims: dict[str, ManagedProcess], fmt: str, path: str) -> None:
    headers = post(sims["none"], fmt=fmt, path=path)
    assert headers["endpoint-load-metrics"].startswith(PREFIX[fmt.lower()])
    report = parse_orca(headers)
    assert report is not None and set(report) == NAMED
    assert report["named_metrics.num_requests_waiting"] == 0


def test_no_header_without_request_header_or_flag(sims: dict[str, ManagedProcess]) -> None:
    assert "endpoint-load-metrics" not in post(sims["none"])
    assert "endpoint-load-metrics" not in post(sims["none"], fmt="XML")  # unknown: ignored


@pytest.mark.parametrize("fmt", ["text", "json", "bin"])
def test_orca_format_flag_adds_the_header_to_every_non_streaming_response(
    sims: dict[str, ManagedProcess], fmt: str
) -> None:
    headers = post(sims[fmt])
    assert headers["endpoint-load-metrics"].startswith(PREFIX[fmt])
    report = parse_orca(headers)
    assert report is not None and set(report) == NAMED
    # the request's own choice wins over the flag
    other = "text" if fmt != "text" else "json"
    assert post(sims[fmt], fmt=other)["endpoint-load-metrics"].startswith(PREFIX[other])


@pytest.mark.parametrize("name", ["none", "text", "json", "bin"])
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_streaming_responses_carry_no_orca_header(
    sims: dict[str, ManagedProcess], name: str, path: str
) -> None:
    headers = post(sims[name], stream=True, fmt="TEXT", path=path)
    assert "endpoint-load-metrics" not in headers
    assert headers["content-type"].startswith("text/event-stream")


def test_header_reports_the_live_engine_state(sims: dict[str, ManagedProcess]) -> None:
    sim = sims["none"]
    url = sim.info["url"]
    long_body = {"model": "sim-model", "prompt": "x" * 400, "max_tokens": 5000, "stream": True}
    # a long streaming request keeps one sequence running and holds KV blocks
    sock = open_raw_post(url, "/v1/completions", json.dumps(long_body).encode())
    try:
        wait_for(lambda: get_json(f"{url}/sim/stats")["running"] == 1, what="long request runs")
        report = parse_orca(post(sim, fmt="TEXT"))
        assert report is not None
        assert report["named_metrics.num_requests_running"] == 1.0
        assert report["named_metrics.num_requests_waiting"] == 0.0
        assert 0 < report["named_metrics.kv_cache_usage_perc"] <= 1
    finally:
        sock.close()
    wait_for(lambda: get_json(f"{url}/sim/stats")["running"] == 0, what="long request freed")
    report = parse_orca(post(sim, fmt="BIN"))
    assert report is not None
    assert report["named_metrics.num_requests_running"] == 0.0


def test_ready_file_has_no_orca_port_without_the_flag(sims: dict[str, ManagedProcess]) -> None:
    assert "orca_port" not in sims["none"].info


def test_orca_flags_parse_and_validate(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="epp sim")
    add_arguments(parser)
    defaults = parser.parse_args([])
    assert (defaults.orca_format, defaults.orca_port) == ("none", None)
    args = parser.parse_args(["--orca-format", "BIN", "--orca-port", "0"])
    assert (args.orca_format, args.orca_port) == ("bin", 0)
    for bad in (["--orca-format", "xml"], ["--orca-port", "70000"]):
        with pytest.raises(SystemExit):
            parser.parse_args(bad)
    assert "--orca-port" in parser.format_help() and "--orca-format" in parser.format_help()


def test_sim_refuses_an_orca_port_it_cannot_bind(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = spawn_epp(tmp_path, "sim-bad", "sim", "--port", "0", "--orca-port", str(port))
        try:
            wait_for(lambda: not proc.alive(), what="the simulator to exit")
        finally:
            code = proc.stop()
    assert code == 1
    assert "cannot listen for ORCA" in proc.log_tail()
