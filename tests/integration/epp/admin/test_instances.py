"""``epp serve`` admin API without Envoy: refused when no key is configured, and the
state file keeping runtime-added instances across a restart (a corrupt one ignored)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from epp_harness.procs import ManagedProcess, start_epp
from tests.support.http import request

KEY = "k3y"


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[str]:
    proc = start_epp(tmp_path, "sim", "sim", "--port", "0", "--time-scale", "0")
    try:
        yield f"{proc.info['host']}:{proc.info['port']}"
    finally:
        proc.stop()


def serve(tmp_path: Path, *args: str) -> ManagedProcess:
    return start_epp(
        tmp_path, "epp", "serve", "--grpc-port", "0", "--http-port", "0",
        "--grpc-health-port", "0", *args
    )  # fmt: skip


def call(proc: ManagedProcess, path: str, doc: object, key: str | None = KEY) -> tuple[int, Any]:
    headers = {"X-Api-Key": key} if key else {}
    url = f"http://127.0.0.1:{proc.info['http_port']}{path}"
    status, _, body = request(url, orjson.dumps(doc), headers=headers)
    return status, json.loads(body)


def test_without_a_key_mutations_are_refused_with_how_to_enable(tmp_path: Path) -> None:
    proc = serve(tmp_path)
    try:
        status, body = call(proc, "/instances/add", {"type": "decode", "instance": "1.2.3.4:5"})
        assert status == 403 and body["error"]["code"] == "admin_api_disabled"
        assert "ADMIN_API_KEY" in body["error"]["message"]
        assert "--admin-api-key-file" in body["error"]["message"]
        assert call(proc, "/status", {})[0] == 200
    finally:
        proc.stop()


def test_runtime_instances_survive_a_restart(tmp_path: Path, sim: str) -> None:
    key_file, state = tmp_path / "key", tmp_path / "state.json"
    key_file.write_text(KEY)
    flags = ("--admin-api-key-file", str(key_file), "--state-file", str(state))
    proc = serve(tmp_path, *flags)
    try:
        status, body = call(proc, "/instances/add", {"type": "prefill", "instance": sim})
        assert status == 200 and body["current_prefill_instances"] == [sim]
    finally:
        proc.stop()
    saved = json.loads(state.read_text())["instances"]
    assert saved == [{"instance": sim, "type": "prefill", "engine": "vllm"}]
    proc = serve(tmp_path, *flags)
    try:
        _, doc = call(proc, "/status", {})
        assert doc["prefill_nodes"] == [sim] and doc["prefill_node_count"] == 1
        call(proc, "/instances/remove", {"type": "prefill", "instance": sim})
        assert json.loads(state.read_text())["instances"] == []
    finally:
        proc.stop()


def test_corrupt_state_file_is_reported_not_fatal(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    state.write_text('{"version": 1, "instances": [')
    proc = serve(tmp_path, "--state-file", str(state))
    try:
        assert call(proc, "/status", {})[1]["endpoints"] == []
    finally:
        proc.stop()
    assert "is corrupt" in proc.log_tail(200)
