"""``epp serve --access-log`` through a real Envoy: each routed request gets one line in
the EPP's log naming its id, model, the endpoints Envoy got (the one that answered
first), and the time the pick took -- with the EPP otherwise at --log-level warning."""

from __future__ import annotations

import re
from collections.abc import Iterator

import orjson
import pytest

from epp_harness.stack import LocalStack
from tests.e2e.conftest import ephemeral
from tests.support.http import request
from tests.support.wait import wait_for

pytestmark = pytest.mark.e2e
BODY = orjson.dumps({"model": "sim-model", "prompt": "hello there", "max_tokens": 4})
LINE = re.compile(
    r"routed request_id=(?P<request_id>\S+) model=(?P<model>\S+) endpoints=(?P<endpoints>\S+) "
    r"prefill=(?P<prefill>\S+) decision=(?P<decision>\S+) "
    r"predicted_ttft_ms=(?P<predicted>\S+) flow=(?P<flow>\S+) scheduling_ms=(?P<ms>\S+)$"
)


@pytest.fixture(scope="module")
def stack() -> Iterator[LocalStack]:
    with LocalStack(ephemeral(servers=2, epp_args=["--access-log"])) as s:
        yield s


def lines(stack: LocalStack, request_id: str) -> list[re.Match[str]]:
    text = (stack.workdir / "epp.log").read_text(errors="replace")
    found = (LINE.search(line) for line in text.splitlines() if request_id in line)
    return [m for m in found if m is not None]


def test_each_routed_request_gets_one_line_with_its_decision(stack: LocalStack) -> None:
    for i in range(3):
        request_id = f"access-log-{i}"
        status, headers, _ = request(
            f"{stack.envoy_url}/v1/completions", BODY, headers={"x-request-id": request_id}
        )
        assert status == 200
        wait_for(lambda rid=request_id: lines(stack, rid), what=f"the line of {request_id}")
        [line] = lines(stack, request_id)
        endpoints = line["endpoints"].split(",")
        assert line["model"] == "sim-model"
        assert set(endpoints) <= set(stack.sim_addresses) and len(set(endpoints)) == len(endpoints)
        assert headers["x-sim-instance"] == endpoints[0]  # the primary answered
        # a short prompt with no prefill server: the P/D handler decodes it in place
        assert line["prefill"] == "-" and line["decision"] == "decode-only"
        assert line["flow"] == "-" and line["request_id"] == request_id  # flow control off
        assert float(line["ms"]) >= 0.0


def test_a_request_without_a_body_is_no_decision(stack: LocalStack) -> None:
    status, _, _ = request(f"{stack.envoy_url}/v1/models", headers={"x-request-id": "models-1"})
    assert status == 200
    request(f"{stack.envoy_url}/v1/completions", BODY, headers={"x-request-id": "after-1"})
    wait_for(lambda: lines(stack, "after-1"), what="the line of the request after it")
    assert lines(stack, "models-1") == []  # (lines are written in order)
