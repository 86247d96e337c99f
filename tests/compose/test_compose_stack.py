"""`make test-compose` (docs/compose.md; opt-in, not collected by `make test`): the
unchanged docker-compose.yml on a real Docker engine, through Envoy's published port.
tools/compose-machine.sh has readied the engine, Compose (EPP_COMPOSE names its binary)
and the image; this module brings the stack up, waits for every health check, sends
requests and takes the stack down again."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.http import metric_samples, request

ROOT = Path(__file__).resolve().parents[2]
ENVOY = "http://127.0.0.1:8081"
EPP_METRICS = "http://127.0.0.1:9090/metrics"
PREFILL_OK = 'epp_prefill_legs_total{coordinator="nixl",outcome="ok"}'

pytestmark = pytest.mark.e2e


def compose(*args: str) -> None:
    command = [os.environ["EPP_COMPOSE"], "--project-directory", str(ROOT), *args]
    print("+", " ".join(command[1:]), flush=True)
    subprocess.run(command, cwd=ROOT, check=True, timeout=300)


@pytest.fixture(scope="module")
def stack() -> Iterator[None]:
    # --wait: until every service's health check passes (depends_on orders them)
    try:
        compose("up", "--detach", "--wait", "--wait-timeout", "180")
        yield
    finally:
        compose("down", "--timeout", "5")


def complete(prompt: str) -> tuple[str, dict[str, str]]:
    body = {"model": "sim-model", "prompt": prompt, "max_tokens": 8}
    status, headers, raw = request(f"{ENVOY}/v1/completions", json.dumps(body).encode())
    assert status == 200, raw[:300]
    assert json.loads(raw)["choices"][0]["text"]
    return headers["x-sim-instance"], headers


def prefill_legs_ok() -> float:
    return metric_samples(EPP_METRICS).get(PREFILL_OK, 0.0)


def test_a_short_request_is_decoded_on_a_decode_container(stack: None) -> None:
    before = prefill_legs_ok()
    instance, _ = complete("Hello")
    assert instance in {"decode-1", "decode-2"}
    assert prefill_legs_ok() == before  # too short to be worth a prefill leg


def test_a_long_prompt_is_prefilled_then_decoded(stack: None) -> None:
    before = prefill_legs_ok()
    instance, _ = complete(("The quick brown fox jumps over the lazy dog. " * 27)[:1200])
    assert instance in {"decode-1", "decode-2"}
    # the EPP ran the NIXL prefill leg on prefill-1 or -2 before Envoy sent the decode
    assert prefill_legs_ok() == before + 1
