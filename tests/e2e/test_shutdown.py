"""Stopping the EPP (SIGTERM) lets requests already routed finish."""

from __future__ import annotations

import signal

import orjson
import pytest

from epp.extproc.transport import TRANSPORTS
from epp_harness.stack import LocalStack
from tests.e2e.conftest import ephemeral
from tests.support.http import open_raw_post

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("transport", sorted(TRANSPORTS))
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
