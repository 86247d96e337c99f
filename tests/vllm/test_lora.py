"""A LoRA adapter on a real vLLM server (CPU, ``--enable-lora``) behind Envoy and the
EPP: a random rank-8 adapter built offline with ``peft`` (build_adapter.py), loaded on
demand by the EPP's placement through vLLM's runtime API, served through Envoy, and the
server's ``vllm:lora_requests_info`` as the EPP reads it."""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openai import OpenAI

from epp_harness.stack import LocalStack
from tests.support.http import get_json, request
from tests.support.wait import wait_for
from tests.vllm.conftest import epp_stack, status
from tests.vllm.servers import MODEL_NAME, VllmServer, log, model_dir, vllm_python, vllm_servers

pytestmark = pytest.mark.e2e
ADAPTER = "tiny-lora"
BUILD = Path(__file__).resolve().parent / "build_adapter.py"
LORA_FLAGS = ["--enable-lora", "--max-loras", "1", "--max-lora-rank", "8"]
RUNTIME_API = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}


@pytest.fixture(scope="module")
def adapter(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("adapter") / ADAPTER
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    subprocess.run([vllm_python(), str(BUILD), str(model_dir()), str(out)], check=True, env=env)
    return out


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, adapter: Path) -> Iterator[VllmServer]:
    workdir = tmp_path_factory.mktemp("vllm-lora")
    with vllm_servers(workdir, [("vllm-lora", LORA_FLAGS, RUNTIME_API)]) as started:
        yield started[0]


@pytest.fixture(scope="module")
def stack(
    server: VllmServer, adapter: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalStack]:
    config = (
        f"models:\n  adapters: {{{ADAPTER}: {adapter}}}\n"
        "loraPlacement: {enabled: true, maxAdaptersPerServer: 1}\n"
    )
    with epp_stack(
        tmp_path_factory.mktemp("epp-lora"), ["--endpoint", server.address], config=config
    ) as s:
        yield s


def served_models(server: VllmServer) -> list[str]:
    return [m["id"] for m in get_json(f"{server.url}/v1/models")["data"]]


def loads(stack: LocalStack) -> dict[str, float]:
    """``epp_lora_adapter_loads_total`` by result, the nonzero ones."""
    _, _, body = request(f"{stack.epp_http_url}/metrics")
    out = {}
    for line in body.decode().splitlines():
        if line.startswith("epp_lora_adapter_loads_total{") and float(line.rsplit(" ", 1)[1]):
            out[line.split('result="', 1)[1].split('"', 1)[0]] = float(line.rsplit(" ", 1)[1])
    return out


def lora_state(stack: LocalStack) -> dict[str, Any]:
    doc: dict[str, Any] = status(stack)["endpoints"][0]["load"].get("lora", {})
    return doc


def test_placement_loads_the_adapter_and_envoy_serves_it(
    stack: LocalStack, server: VllmServer
) -> None:
    assert served_models(server) == [MODEL_NAME]  # nothing loaded at start
    client = OpenAI(base_url=f"{stack.envoy_url}/v1", api_key="unused", max_retries=0)
    done = client.completions.create(model=ADAPTER, prompt="hello world", max_tokens=4)
    assert done.model == ADAPTER and done.choices[0].text
    assert ADAPTER in served_models(server)  # loaded by the EPP through the runtime API
    assert loads(stack) == {"ok": 1.0}
    assert get_json(f"{stack.epp_http_url}/lora/adapters")["servers"] == {server.address: [ADAPTER]}
    # a second request sticks: no second load
    client.completions.create(model=ADAPTER, prompt="hello again", max_tokens=4)
    assert loads(stack) == {"ok": 1.0}
    log(f"adapter {ADAPTER} loaded by placement and served: {done.choices[0].text!r}")


def test_the_epp_reads_lora_requests_info(stack: LocalStack, server: VllmServer) -> None:
    client = OpenAI(base_url=f"{stack.envoy_url}/v1", api_key="unused", max_retries=0)
    client.completions.create(model=ADAPTER, prompt="warm up", max_tokens=2)
    wait_for(lambda: lora_state(stack).get("max_lora") == 1, 10, "max_lora in /status")
    long = threading.Thread(
        target=lambda: client.completions.create(
            model=ADAPTER, prompt="a long answer", max_tokens=1500, extra_body={"ignore_eos": True}
        )
    )
    long.start()
    try:
        wait_for(lambda: lora_state(stack).get("running") == [ADAPTER], 60, "the adapter running")
        log(f"EPP /status while it runs: {lora_state(stack)}")
        page = server.metrics()
        info = [line for line in page.splitlines() if line.startswith("vllm:lora_requests_info{")]
        newest = max(info, key=lambda line: float(line.rsplit(" ", 1)[1]), default=None)
        log(f"the server's newest series: {newest}")
        assert any(f'running_lora_adapters="{ADAPTER}"' in line for line in info)
    finally:
        long.join(timeout=300)
    wait_for(lambda: lora_state(stack).get("running") == [], 20, "the adapter idle")
    assert status(stack)["endpoints"][0]["in_flight"] == 0
