"""Flow control through the real Envoy, the EPP and simulators: 2 servers, the EPP
keeping 1 request on each (maxConcurrency), so the third waits in the EPP. Envoy's
ext_proc message timeout is 1 s here: every wait longer than that is served only
because the EPP extended it (override_message_timeout)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import orjson
import pytest

from epp_harness.stack import LocalStack
from tests.e2e.conftest import ephemeral
from tests.support.http import epp_in_flight, get_json, metric_samples, open_raw_post, request
from tests.support.transports import transports
from tests.support.wait import quiesce, wait_for

pytestmark = pytest.mark.e2e
MODEL = "sim-model"
QUEUE_METRIC = "llm_d_epp_flow_control_request_queue_duration_seconds_count"


@pytest.fixture(scope="module", params=transports())
def stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalStack]:
    """Each gRPC transport: each reads the stream's end while a request waits."""
    config = tmp_path_factory.mktemp("flow") / "epp.yaml"
    config.write_text("saturationDetector: {maxConcurrency: 1}\nflowControl: {enabled: true}\n")
    opts = ephemeral(
        servers=2,
        sim_args=["--time-scale", "0.5"],
        epp_args=["--config", str(config), "--transport", request.param],
        message_timeout_s=1.0,
    )
    with LocalStack(opts) as s:
        yield s


Result = tuple[int, float, bytes, dict[str, str]]


def complete(
    stack: LocalStack, name: str, tokens: int = 150, headers: dict[str, str] | None = None
) -> Result:
    """(status, the time it finished, body, headers)."""
    body = orjson.dumps({"model": MODEL, "prompt": name, "max_tokens": tokens})
    status, h, raw = request(f"{stack.envoy_url}/v1/completions", body, headers=headers)
    return status, time.monotonic(), raw, h


def queued(stack: LocalStack) -> int:
    return int(get_json(f"{stack.epp_http_url}/status")["flow_control"]["requests"])


def outcomes(stack: LocalStack) -> dict[str, float]:
    samples = metric_samples(f"{stack.epp_http_url}/metrics", "llm_d_epp_flow_control")
    out: dict[str, float] = {}
    for key, value in samples.items():
        if key.startswith(QUEUE_METRIC):
            outcome = key.split('outcome="')[1].split('"')[0]
            out[outcome] = out.get(outcome, 0.0) + value
    return out


def idle(stack: LocalStack) -> None:
    """Nothing queued or in flight, every stream ended (and counted)."""
    quiesce(stack)  # a request held in a queue has its stream open
    assert queued(stack) == 0


def fill(stack: LocalStack, pool: ThreadPoolExecutor, tokens: int = 400) -> list[Future[Result]]:
    """Occupy both servers (their one request each) with long requests."""
    busy = [pool.submit(complete, stack, f"busy {i}", tokens) for i in range(2)]
    wait_for(lambda: epp_in_flight(stack.epp_http_url) == 2, what="both servers busy")
    return busy


def test_saturated_pool_queues_then_serves(stack: LocalStack) -> None:
    idle(stack)
    before = outcomes(stack)
    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(complete, stack, f"load {i}") for i in range(8)]
        wait_for(lambda: queued(stack) > 0, what="requests held in the EPP")
        results = [f.result(timeout=60) for f in futures]
    assert all(r[0] == 200 for r in results), [r[2] for r in results if r[0] != 200]
    idle(stack)
    after = outcomes(stack)
    assert after.get("Dispatched", 0) - before.get("Dispatched", 0) == 8


def test_a_queued_client_that_disconnects_is_removed(stack: LocalStack) -> None:
    idle(stack)
    before = outcomes(stack).get("EvictedContextCancelled", 0)
    with ThreadPoolExecutor(4) as pool:
        busy = fill(stack, pool)
        body = orjson.dumps({"model": MODEL, "prompt": "walks away", "max_tokens": 5})
        sock = open_raw_post(stack.envoy_url, "/v1/completions", body)
        wait_for(lambda: queued(stack) == 1, what="the request held")
        sock.close()
        wait_for(lambda: queued(stack) == 0, what="the request to leave the queue")
        assert outcomes(stack).get("EvictedContextCancelled", 0) == before + 1
        assert epp_in_flight(stack.epp_http_url) == 2  # only the busy ones
        assert all(f.result(timeout=60)[0] == 200 for f in busy)
    idle(stack)


def test_queue_timeout_gives_the_json_error(stack: LocalStack) -> None:
    idle(stack)
    with ThreadPoolExecutor(4) as pool:
        busy = fill(stack, pool)
        status, _, raw, headers = complete(stack, "impatient", 5, {"x-epp-queue-timeout-ms": "300"})
        assert status == 429, raw  # the pool has endpoints, all busy
        error = orjson.loads(raw)["error"]
        assert error["code"] == "queue_timeout" and error["type"] == "rate_limit_exceeded"
        assert headers.get("retry-after") == "1"
        assert headers.get("x-llm-d-request-dropped-reason") == "rejected-ttl-expired"
        status, _, raw, headers = complete(stack, "bad", 5, {"x-epp-queue-timeout-ms": "soon"})
        assert status == 400 and orjson.loads(raw)["error"]["code"] == "invalid_queue_timeout"
        assert "x-llm-d-request-dropped-reason" not in headers
        assert all(f.result(timeout=60)[0] == 200 for f in busy)
    idle(stack)


def test_two_fairness_ids_share_throughput(stack: LocalStack) -> None:
    idle(stack)
    a = {"x-llm-d-inference-fairness-id": "tenant-a"}
    b = {"x-llm-d-inference-fairness-id": "tenant-b"}
    with ThreadPoolExecutor(16) as pool:
        busy = fill(stack, pool)
        flood = [pool.submit(complete, stack, f"a {i}", 60, a) for i in range(10)]
        wait_for(lambda: queued(stack) == 10, what="tenant A's flood held")
        light = [pool.submit(complete, stack, f"b {i}", 60, b) for i in range(2)]
        wait_for(lambda: queued(stack) == 12, what="tenant B's requests held")
        done_a = sorted(f.result(timeout=90)[1] for f in flood)
        done_b = sorted(f.result(timeout=90)[1] for f in light)
        assert all(f.result(timeout=60)[0] == 200 for f in busy)
    # round robin: B's two go among the first four dispatches, not behind A's ten
    assert done_b[-1] < done_a[5], (done_a, done_b)
    idle(stack)


def test_a_critical_request_goes_ahead_of_queued_standard_ones(stack: LocalStack) -> None:
    idle(stack)
    with ThreadPoolExecutor(16) as pool:
        busy = fill(stack, pool)
        standard = [pool.submit(complete, stack, f"std {i}", 60) for i in range(6)]
        wait_for(lambda: queued(stack) == 6, what="standard requests held")
        critical = pool.submit(
            complete, stack, "urgent", 60, {"x-gateway-inference-priority": "10"}
        )
        status, done, _, _ = critical.result(timeout=60)
        finished = sorted(f.result(timeout=60)[1] for f in standard)
        assert all(f.result(timeout=60)[0] == 200 for f in busy)
    assert status == 200
    # dispatched first when a slot freed: at most one standard one (dispatched on the
    # other server at the same moment) finishes before it
    assert sum(t < done for t in finished) <= 1, (done, finished)
    idle(stack)
