"""``epp sim --enable-lora`` as a real process: vLLM's runtime adapter API (request and
error shapes), adapters in /v1/models, requests for unknown adapters, the
vllm:lora_requests_info series, and the metric dialects."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from epp_harness.procs import ManagedProcess, start_epp

BASE = "base-model"


def http(url: str, doc: Any = None) -> tuple[int, str, bytes]:
    """(status, content type, body); HTTP errors are answers too."""
    data = None if doc is None else json.dumps(doc).encode()
    req = urllib.request.Request(url, data=data, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.headers.get("content-type", ""), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.headers.get("content-type", ""), err.read()


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    workdir = tmp_path_factory.mktemp("sim-lora")
    proc = start_epp(
        workdir, "sim", "sim", "--port", "0", "--model", BASE, "--time-scale", "1",
        "--max-loras", "1", "--lora-modules", "sql=/adapters/sql", "chat=/adapters/chat",
        "--decode-ms-per-token", "20",
    )  # fmt: skip
    yield proc.info["url"]
    assert proc.stop() == 0
    assert "Traceback" not in proc.log_tail(500)


def complete(url: str, model: str, max_tokens: int = 1) -> tuple[int, Any]:
    status, _, body = http(
        f"{url}/v1/completions", {"model": model, "prompt": "hello", "max_tokens": max_tokens}
    )
    return status, json.loads(body)


def lora_series(url: str) -> list[tuple[dict[str, str], float]]:
    _, _, text = http(f"{url}/metrics")
    return [
        (dict(s.labels), s.value)
        for family in text_string_to_metric_families(text.decode())
        for s in family.samples
        if s.name == "vllm:lora_requests_info"
    ]


def test_models_lists_the_adapters_after_the_base_model(sim: str) -> None:
    _, _, body = http(f"{sim}/v1/models")
    cards = json.loads(body)["data"]
    assert [c["id"] for c in cards] == [BASE, "sql", "chat"]
    assert cards[1]["root"] == "/adapters/sql" and cards[1]["parent"] == BASE


def test_an_adapter_is_served_and_an_unknown_one_is_vllms_404(sim: str) -> None:
    status, body = complete(sim, "sql")
    assert status == 200 and body["model"] == "sql"
    status, body = complete(sim, "nope")
    assert status == 404
    assert body["error"]["message"] == "The model `nope` does not exist."
    assert body["error"]["type"] == "NotFoundError"


def test_load_and_unload_at_runtime_with_vllms_shapes(sim: str) -> None:
    status, ctype, body = http(
        f"{sim}/v1/load_lora_adapter", {"lora_name": "fresh", "lora_path": "/adapters/fresh"}
    )
    assert (status, body) == (200, b"Success: LoRA adapter 'fresh' added successfully.")
    assert ctype.startswith("text/plain")
    assert complete(sim, "fresh")[0] == 200
    status, _, body = http(
        f"{sim}/v1/load_lora_adapter", {"lora_name": "fresh", "lora_path": "/adapters/fresh"}
    )
    assert status == 400
    assert json.loads(body)["error"] == {
        "message": "The lora adapter 'fresh' has already been loaded.",
        "type": "InvalidUserInput",
        "param": None,
        "code": 400,
    }
    status, _, body = http(f"{sim}/v1/load_lora_adapter", {"lora_name": "x"})
    assert status == 400
    assert json.loads(body)["error"]["message"] == (
        "Both 'lora_name' and 'lora_path' must be provided."
    )
    status, _, body = http(f"{sim}/v1/unload_lora_adapter", {"lora_name": "fresh"})
    assert (status, body) == (200, b"Success: LoRA adapter 'fresh' removed successfully.")
    assert complete(sim, "fresh")[0] == 404
    status, _, body = http(f"{sim}/v1/unload_lora_adapter", {"lora_name": "fresh"})
    assert status == 404
    assert json.loads(body)["error"]["message"] == "The lora adapter 'fresh' cannot be found."


def test_lora_requests_info_shows_running_and_waiting_adapters(sim: str) -> None:
    # one slot: while a long sql request runs, a chat request waits for the slot
    done: list[int] = []
    slow = threading.Thread(target=lambda: done.append(complete(sim, "sql", 40)[0]))
    slow.start()
    waiter = None
    try:
        for _ in range(100):
            newest = max(lora_series(sim), key=lambda s: s[1])[0]
            if newest["running_lora_adapters"] == "sql":
                break
        waiter = threading.Thread(target=lambda: done.append(complete(sim, "chat")[0]))
        waiter.start()
        for _ in range(100):
            newest = max(lora_series(sim), key=lambda s: s[1])[0]
            if newest["waiting_lora_adapters"] == "chat":
                break
        assert newest == {
            "max_lora": "1",
            "running_lora_adapters": "sql",
            "waiting_lora_adapters": "chat",
        }
        _, _, text = http(f"{sim}/metrics")
        assert b'vllm:num_requests_waiting{model_name="base-model"} 1.0' in text
    finally:
        slow.join()
        if waiter is not None:
            waiter.join()
    assert done == [200, 200]
    series = lora_series(sim)
    assert len(series) > 2  # old label sets stay, with their old timestamps
    newest = max(series, key=lambda s: s[1])[0]
    assert newest["running_lora_adapters"] == "" and newest["waiting_lora_adapters"] == ""


@pytest.mark.parametrize(
    ("dialect", "waiting", "kv"),
    [
        ("sglang", "sglang:num_queue_reqs", "sglang:token_usage"),
        ("trtllm", "trtllm_num_requests_waiting", "trtllm_kv_cache_utilization"),
    ],
)
def test_metrics_dialects(tmp_path: Path, dialect: str, waiting: str, kv: str) -> None:
    proc: ManagedProcess = start_epp(
        tmp_path, "sim", "sim", "--port", "0", "--time-scale", "0", "--metrics-dialect", dialect
    )
    try:
        _, _, text = http(f"{proc.info['url']}/metrics")
    finally:
        assert proc.stop() == 0
    names = {f.name for f in text_string_to_metric_families(text.decode())}
    assert waiting in names and kv in names
    assert not any(n.startswith("vllm:") for n in names)
