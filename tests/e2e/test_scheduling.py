"""The scheduling brain end to end: real Envoy, EPP (default config unless stated),
simulators whose /metrics the EPP scrapes."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import orjson
import pytest

from epp_harness.stack import LocalStack
from tests.e2e.conftest import ephemeral
from tests.support.http import epp_in_flight, held, metric_sum, request
from tests.support.wait import wait_for

pytestmark = pytest.mark.e2e
MODEL = "sim-model"


def complete(stack: LocalStack, prompt: str, headers: dict[str, str] | None = None,
             max_tokens: int = 4, timeout: float = 30.0) -> tuple[int, str, bytes]:  # fmt: skip
    body = orjson.dumps({"model": MODEL, "prompt": prompt, "max_tokens": max_tokens})
    status, h, raw = request(
        f"{stack.envoy_url}/v1/completions", body, headers=headers, timeout=timeout
    )
    return status, h.get("x-sim-instance", ""), raw


@pytest.fixture(scope="module")
def four() -> Iterator[LocalStack]:
    with LocalStack(ephemeral(servers=4, sim_args=["--time-scale", "0.1"])) as s:
        yield s


def test_shared_prefixes_stick_while_others_spread(four: LocalStack) -> None:
    groups = {g: f"System prompt of group {g}: " + f"rules {g} and more. " * 120 for g in "ABC"}
    served: dict[str, set[str]] = {g: set() for g in groups}
    for i in range(6):
        for g, prefix in groups.items():
            status, instance, _ = complete(four, prefix + f"question {i}?")
            assert status == 200
            served[g].add(instance)
    assert all(len(s) == 1 for s in served.values()), served

    def unrelated(i: int) -> str:
        status, instance, _ = complete(four, f"unrelated {i} " * 30, max_tokens=20)
        assert status == 200
        return instance

    with ThreadPoolExecutor(8) as pool:
        spread = set(pool.map(unrelated, range(24)))
    assert len(spread) >= 3, spread


def test_server_whose_metrics_stop_is_no_longer_preferred(tmp_path: Path) -> None:
    config = tmp_path / "epp.yaml"
    config.write_text("dataLayer: {staleAfterSeconds: 0.3}\n")
    opts = ephemeral(servers=2, sim_args=["--time-scale", "0"], epp_args=["--config", str(config)])
    with LocalStack(opts) as stack:
        broken, healthy = stack.sim_addresses
        assert request(f"http://{broken}/sim/faults", b'{"metrics_down": true}')[0] == 200

        def scrape_failures() -> float:
            _, _, text = request(f"{stack.epp_http_url}/metrics")
            lines = [ln for ln in text.decode().splitlines() if broken in ln]
            return metric_sum("\n".join(lines), "epp_scrape_failures_total")

        wait_for(lambda: scrape_failures() > 0, what="scrape failures on the broken server")

        attempt = iter(range(10_000))  # fresh prompts per try: no prefix affinity

        def all_to_healthy() -> bool:
            n = next(attempt)
            return all(complete(stack, f"p{n}.{i} " * 50)[1] == healthy for i in range(10))

        wait_for(all_to_healthy, timeout=10, what="stale server to lose preference")
        assert request(f"http://{broken}/sim/faults", b'{"metrics_down": false}')[0] == 200

        def broken_used_again() -> bool:
            n = next(attempt)
            return any(complete(stack, f"q{n}.{i} " * 50)[1] == broken for i in range(20))

        wait_for(broken_used_again, timeout=10, what="recovered server to be used again")


def test_saturated_pool_sheds_only_sheddable_requests(tmp_path: Path) -> None:
    config = tmp_path / "epp.yaml"  # without flow control: nothing held, sheddable shed
    config.write_text("flowControl: {enabled: false}\n")
    opts = ephemeral(servers=2, sim_args=["--time-scale", "0.5", "--max-num-seqs", "1"],
                     epp_args=["--config", str(config)])  # fmt: skip
    with LocalStack(opts) as stack, ThreadPoolExecutor(1) as pool:
        calm = complete(stack, "calm", {"x-gateway-inference-priority": "-1"})
        assert calm[0] == 200  # not saturated: sheddable requests are served

        def pool_saturated() -> bool:  # no endpoint has room: 5+ waiting on each
            _, _, text = request(f"{stack.epp_http_url}/metrics")
            depths = [
                float(line.rsplit(" ", 1)[1])
                for line in text.decode().splitlines()
                if line.startswith("epp_endpoint_queue_depth{")
            ]
            return len(depths) == 2 and min(depths) >= 5

        def shed() -> bool:
            status, _, raw = complete(stack, "x", {"x-gateway-inference-priority": "-1"}, 1)
            if status == 429:
                error = orjson.loads(raw)["error"]
                assert error["code"] == "shed" and "saturated" in error["message"]
                return True
            return False

        # each server runs 1 long request and queues 7, sent straight to it (the EPP sees
        # them only in the server's metrics) and held until the checks below are done
        long = [orjson.dumps({"model": MODEL, "prompt": f"load {i} " * 20, "max_tokens": 300})
                for i in range(8)]  # fmt: skip
        with ExitStack() as load:
            for url in stack.sim_urls:
                load.enter_context(held(url, "/v1/completions", long))
            wait_for(pool_saturated, timeout=20, what="the EPP to see 5+ queued on each server")
            wait_for(shed, timeout=20, what="a sheddable request to be shed")
            critical = pool.submit(complete, stack, "important", None, 1, 120)
            # routed while the pool is saturated: it waits behind the load on a server
            # (had it been shed, its 429 would end it at once and fail the check below)
            wait_for(
                lambda: critical.done() or epp_in_flight(stack.epp_http_url) >= 1,
                what="the critical request routed",
            )
        assert critical.result(timeout=150)[0] == 200  # never shed
        wait_for(lambda: complete(stack, "later", {"x-gateway-inference-priority": "-1"})[0]
                 == 200, timeout=20, what="sheddable requests served again")  # fmt: skip
