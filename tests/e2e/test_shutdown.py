"""Stopping the EPP (SIGTERM) lets requests already routed finish; requests held by
flow control are answered 503 at once."""

from __future__ import annotations

import signal
from pathlib import Path

import orjson
import pytest

from epp_harness.stack import LocalStack
from tests.e2e.conftest import ephemeral
from tests.support.http import get_json, open_raw_post
from tests.support.transports import transports
from tests.support.wait import wait_for

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("transport", transports())
def test_streaming_request_survives_epp_shutdown(transport: str) -> None:
    opts = ephemeral(
        servers=1, sim_args=["--time-scale", "0.3"], epp_args=["--transport", transport]
    )
    with LocalStack(opts) as stack:
        assert stack.epp is not None
        body = orjson.dumps(
            {"model": "sim-model", "prompt": "x", "max_tokens": 300, "stream": True}
        )
        with open_raw_post(stack.envoy_url, "/v1/completions", body, close=True) as s:
            received = s.recv(4096)
            assert b"200 OK" in received
            stack.epp.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
            while chunk := s.recv(65536):
                received += chunk
        assert received.rstrip().endswith(b"0") and b"data: [DONE]" in received
        assert stack.epp.proc.wait(timeout=15) == 0  # type: ignore[union-attr]


@pytest.mark.parametrize("transport", transports())
def test_held_requests_are_answered_at_shutdown(transport: str, tmp_path: Path) -> None:
    config = tmp_path / "epp.yaml"  # one request per server: the second one is held
    config.write_text("saturationDetector: {maxConcurrency: 1}\nflowControl: {enabled: true}\n")
    opts = ephemeral(
        servers=1,
        sim_args=["--time-scale", "0.3"],
        epp_args=["--transport", transport, "--config", str(config)],
    )
    with LocalStack(opts) as stack:
        assert stack.epp is not None
        body = orjson.dumps(
            {"model": "sim-model", "prompt": "x", "max_tokens": 300, "stream": True}
        )
        with open_raw_post(stack.envoy_url, "/v1/completions", body, close=True) as busy:
            assert b"200 OK" in busy.recv(4096)
            short = orjson.dumps({"model": "sim-model", "prompt": "y", "max_tokens": 5})
            with open_raw_post(stack.envoy_url, "/v1/completions", short, close=True) as held:
                status_url = f"{stack.epp_http_url}/status"
                wait_for(lambda: get_json(status_url)["flow_control"]["requests"] == 1,
                         what="the second request held")  # fmt: skip
                stack.epp.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
                answer = b""
                while chunk := held.recv(65536):
                    answer += chunk
            head, _, payload = answer.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 503") and b"retry-after: 1" in head.lower()
            assert b"x-llm-d-request-dropped-reason: rejected-shutting-down" in head.lower()
            assert orjson.loads(payload)["error"]["code"] == "shutting_down"
            while busy.recv(65536):  # the routed one still finishes
                pass
        assert stack.epp.proc.wait(timeout=15) == 0  # type: ignore[union-attr]
