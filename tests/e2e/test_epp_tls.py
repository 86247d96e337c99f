"""Envoy -> TLS -> EPP (ext_proc and EDS on one TLS port) -> simulators, each transport:
the stack `epp stack --epp-tls` runs."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from epp_harness.stack import LocalStack
from tests.e2e.conftest import ephemeral
from tests.support.http import get_json, metric_sum, request
from tests.support.transports import transports

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module", params=transports())
def tls_stack(request: pytest.FixtureRequest) -> Iterator[LocalStack]:
    opts = ephemeral(
        servers=2,
        epp_tls=True,
        sim_args=["--time-scale", "0"],
        epp_args=["--transport", request.param],
    )
    with LocalStack(opts) as s:
        yield s


def envoy_stats(stack: LocalStack) -> str:
    assert stack.envoy is not None
    _, _, body = request(f"{stack.envoy.admin_url}/stats")
    return body.decode()


def stat(text: str, name: str) -> int:
    for line in text.splitlines():
        key, _, value = line.partition(": ")
        if key == name:
            return int(value)
    raise AssertionError(f"no Envoy stat {name}")


def test_chat_completion_through_tls_to_the_epp(tls_stack: LocalStack) -> None:
    before = sum(get_json(f"{u}/sim/stats")["requests_total"] for u in tls_stack.sim_urls)
    client = openai.OpenAI(base_url=f"{tls_stack.envoy_url}/v1", api_key="unused", max_retries=0)
    chat = client.chat.completions.create(
        model="sim-model", messages=[{"role": "user", "content": "Hi over TLS"}], max_tokens=3
    )
    assert chat.choices[0].message.content
    assert chat.usage is not None and chat.usage.completion_tokens == 3
    after = sum(get_json(f"{u}/sim/stats")["requests_total"] for u in tls_stack.sim_urls)
    assert after == before + 1  # a simulator served it
    stats = envoy_stats(tls_stack)
    assert stat(stats, "cluster.epp.ssl.handshake") >= 1  # ext_proc + EDS went over TLS
    assert stat(stats, "cluster.epp.ssl.connection_error") == 0
    assert stat(stats, "cluster.model_servers.membership_total") == 2  # EDS answered
    _, _, raw = request(f"{tls_stack.epp_http_url}/metrics")
    assert metric_sum(raw.decode(), "epp_requests_total") >= 1  # the EPP routed it
