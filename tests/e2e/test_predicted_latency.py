"""The latency model and predicted-latency-scorer end to end: real Envoy, EPP, simulators
that run one sequence at a time (so one long request makes a server busy)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from epp_harness.stack import LocalStack
from tests.e2e.conftest import ephemeral
from tests.support.http import get_json, metric_samples, request
from tests.support.wait import quiesce, wait_for

pytestmark = pytest.mark.e2e
MODEL = "sim-model"
PREFIX = "You are the assistant of group P. Follow these rules carefully. " * 100  # ~1,600 t
CONFIG = """
plugins:
- type: prefix-cache-scorer
- type: predicted-latency-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: predicted-latency-scorer
  - pluginRef: max-score-picker
latencyModel: {maxNumSeqs: 1}
"""


@pytest.fixture(scope="module")
def three(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    config = Path(tmp_path_factory.mktemp("cfg")) / "epp.yaml"
    config.write_text(CONFIG)
    opts = ephemeral(
        servers=3, sim_args=["--max-num-seqs", "1"], epp_args=["--config", str(config)]
    )
    with LocalStack(opts) as s:
        yield s


def complete(
    stack: LocalStack, prompt: str, max_tokens: int, headers: dict[str, str] | None = None
) -> tuple[int, str, bytes]:
    body = orjson.dumps({"model": MODEL, "prompt": prompt, "max_tokens": max_tokens})
    status, h, raw = request(f"{stack.envoy_url}/v1/completions", body, headers=headers)
    return status, h.get("x-sim-instance", ""), raw


def in_flight(stack: LocalStack, address: str) -> float:
    samples = metric_samples(f"{stack.epp_http_url}/metrics", "epp_in_flight_requests")
    return samples.get(f'epp_in_flight_requests{{endpoint="{address}"}}', 0.0)


def in_background(
    stack: LocalStack, prompt: str, max_tokens: int
) -> tuple[threading.Thread, list[str]]:
    served: list[str] = []

    def run() -> None:
        status, instance, _ = complete(stack, prompt, max_tokens)
        assert status == 200
        served.append(instance)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, served


def test_a_busy_home_spills_to_a_second_home_and_comes_back(three: LocalStack) -> None:
    # a long request makes the prefix's home and teaches the EPP how long one takes
    status, home, _ = complete(three, PREFIX + "q0", 150)  # ~1.2 s of decode
    assert status == 200
    assert complete(three, PREFIX + "q1", 4)[1] == home  # a hit on an idle home
    # the home busy with another long request: its one slot frees in ~1.2 s, while a
    # miss elsewhere costs ~0.2 s of prefill: the next request goes to a second home
    busy_home, _ = in_background(three, PREFIX + "q2", 150)
    wait_for(lambda: in_flight(three, home) == 1, what="the long request on the home")
    spill, spilled_to = in_background(three, PREFIX + "q3", 300)  # ~2.4 s: keeps it busy
    wait_for(lambda: spilled_to or sum(in_flight(three, a) for a in three.sim_addresses) == 2,
             what="the spilled request to start")  # fmt: skip
    busy_home.join()
    # the home is idle again, the second home busy: back to the first
    status, back, _ = complete(three, PREFIX + "q4", 4)
    spill.join()
    second = spilled_to[0]
    assert second != home, "a busy home's prefix should spill to another server"
    assert back == home, f"idle home {home} should win over busy second home {second}"
    # both homes are idle now: the prefix never goes to the third, cold server
    for i in range(4):
        assert complete(three, PREFIX + f"q{5 + i}", 4)[1] in {home, second}
    learned = get_json(f"{three.epp_http_url}/status")["endpoints"]
    model = {e["instance"]: e.get("latency_model") for e in learned}
    assert model[home] is not None and model[home]["slots"] == 1
    # long requests there: more than the ~0.05 s the short ones alone would teach
    assert model[home]["slot_s"] > 0.2


def test_slo_headers_are_read_through_envoy(three: LocalStack) -> None:
    url = f"{three.epp_http_url}/metrics"

    def verdicts() -> dict[str, float]:
        quiesce(three)
        return metric_samples(url, "epp_slo_predictions_total")

    before = verdicts()
    key_met = 'epp_slo_predictions_total{prediction="met"}'
    key_missed = 'epp_slo_predictions_total{prediction="missed"}'
    assert complete(three, "hello there", 2, {"x-llm-d-slo-ttft-ms": "60000"})[0] == 200
    assert complete(three, "hello again", 2, {"x-slo-ttft-ms": "0.001"})[0] == 200  # alias
    after = verdicts()
    assert after.get(key_met, 0) == before.get(key_met, 0) + 1
    assert after.get(key_missed, 0) == before.get(key_missed, 0) + 1  # best effort: served
    status, _, body = complete(three, "hello", 2, {"x-llm-d-slo-tpot-ms": "soon"})
    assert status == 400
    error = orjson.loads(body)["error"]
    assert error["code"] == "invalid_slo_header"
    assert "x-llm-d-slo-tpot-ms" in error["message"]
