"""In-flight accounting must cover the whole HTTP exchange in every processing mode:
the EPP learns a request ended only from the ext_proc stream."""

from __future__ import annotations

import hashlib

import orjson
import pytest

from epp_harness.envoyconfig import PROCESSING_MODES, Processing
from epp_harness.stack import LocalStack
from tests.e2e.conftest import ephemeral
from tests.support.http import epp_in_flight, get_json, open_raw_post, request
from tests.support.wait import quiesce, wait_for

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("processing", PROCESSING_MODES)
def test_stream_counts_until_the_response_ends(processing: Processing) -> None:
    opts = ephemeral(servers=1, processing=processing, sim_args=["--time-scale", "0.5"])
    with LocalStack(opts) as stack:
        body = orjson.dumps(
            {"model": "sim-model", "prompt": "x", "max_tokens": 5000, "stream": True}
        )
        with open_raw_post(stack.envoy_url, "/v1/completions", body) as s:
            assert b"200 OK" in s.recv(4096)
            for _ in range(3):  # the response keeps streaming, the count must hold
                assert s.recv(4096)
                assert epp_in_flight(stack.epp_http_url) == 1
        wait_for(lambda: epp_in_flight(stack.epp_http_url) == 0, what="release after disconnect")
        short = orjson.dumps({"model": "sim-model", "prompt": "x", "max_tokens": 2})
        assert request(f"{stack.envoy_url}/v1/completions", short)[0] == 200
        wait_for(lambda: epp_in_flight(stack.epp_http_url) == 0, what="release after completion")
        quiesce(stack)  # and every ext_proc stream ended, in this mode too


def test_buffered_mode_routes_and_forwards_bodies_unchanged() -> None:
    opts = ephemeral(
        servers=2,
        processing="buffered",
        sim_args=["--time-scale", "0"],
        epp_args=["--max-body-bytes", str(2 * 1024 * 1024)],
    )
    with LocalStack(opts) as stack:
        url = f"{stack.envoy_url}/v1/completions"
        prompt = "".join(chr(0x61 + i % 26) for i in range(1024 * 1024))
        body = orjson.dumps({"model": "sim-model", "prompt": prompt, "max_tokens": 1})
        status, headers, _ = request(url, body)
        assert status == 200
        served = headers["x-sim-instance"]
        assert served in stack.sim_addresses
        last = get_json(f"http://{served}/sim/last-request")
        assert last["body_sha256"] == hashlib.sha256(body).hexdigest()
        status, headers, raw = request(url, b"{nope")
        assert status == 400 and orjson.loads(raw)["error"]["code"] == "invalid_json"
        too_big = orjson.dumps({"model": "sim-model", "prompt": "x" * (3 * 1024 * 1024)})
        status, headers, raw = request(url, too_big)
        assert status == 413 and headers["content-type"] == "application/json"
