"""Refused requests say why, as the llm-d Router does: through the real Envoy, the EPP
and one simulator, a refusal carries ``x-llm-d-request-dropped-reason`` beside its JSON
body; an error that is no drop (a bad body) carries none. (Timed out in the queue:
test_flow_control.py; shutting down: test_shutdown.py; an empty pool:
test_through_envoy.py.)"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import orjson
import pytest

from epp_harness.stack import LocalStack
from tests.e2e.conftest import ephemeral
from tests.support.http import epp_in_flight, open_raw_post, request
from tests.support.wait import wait_for

pytestmark = pytest.mark.e2e
REASON = "x-llm-d-request-dropped-reason"
BODY = orjson.dumps({"model": "sim-model", "prompt": "x", "max_tokens": 5})


def post(
    stack: LocalStack, body: bytes, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], dict[str, str]]:
    """(status, response headers, the JSON error)."""
    status, got, raw = request(f"{stack.envoy_url}/v1/completions", body, headers=headers)
    assert got["content-type"] == "application/json", raw
    error: dict[str, str] = json.loads(raw)["error"]
    return status, got, error


def states(stack: LocalStack) -> list[str]:
    _, _, body = request(f"{stack.epp_http_url}/status")
    return [e["state"] for e in json.loads(body)["endpoints"]]


def test_saturated_then_no_endpoint_when_the_only_server_dies(tmp_path: Path) -> None:
    config = tmp_path / "epp.yaml"  # one request per server; sheddable ones shed at once
    config.write_text(
        "saturationDetector: {maxConcurrency: 1}\n"
        "flowControl: {enabled: true, shedSheddable: true}\n"
    )
    opts = ephemeral(
        servers=1, sim_args=["--time-scale", "0.3"], epp_args=["--config", str(config)]
    )
    with LocalStack(opts) as stack:
        status, headers, error = post(stack, b'{"prompt": "no model"}')
        assert (status, error["code"]) == (400, "missing_model") and REASON not in headers

        busy_body = orjson.dumps(
            {"model": "sim-model", "prompt": "busy", "max_tokens": 300, "stream": True}
        )
        with open_raw_post(stack.envoy_url, "/v1/completions", busy_body, close=True) as busy:
            assert b"200 OK" in busy.recv(4096)
            wait_for(lambda: epp_in_flight(stack.epp_http_url) == 1, what="the server busy")
            status, headers, error = post(stack, BODY, {"x-gateway-inference-priority": "-1"})
            assert (status, error["code"]) == (429, "shed")
            assert headers[REASON] == "rejected-saturated"
        wait_for(lambda: epp_in_flight(stack.epp_http_url) == 0, what="the busy one gone")

        (sim,) = stack.sims
        assert sim.proc is not None
        sim.proc.send_signal(signal.SIGKILL)
        sim.proc.wait()
        wait_for(lambda: states(stack) == ["ejected"], what="the dead server ejected")
        status, headers, error = post(stack, BODY)
        assert (status, error["code"]) == (503, "no_endpoint")
        assert headers[REASON] == "rejected-no-endpoints"
