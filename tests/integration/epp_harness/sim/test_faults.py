"""Injected faults on a real simulator: a share of requests answered with an error in
vLLM's shape, seeded; /metrics failing or slow; both changed at runtime."""

from __future__ import annotations

import time
from pathlib import Path

import orjson

from tests.support.http import request
from tests.support.sim import SimProc, completion, sims


def statuses(sim: SimProc, n: int) -> list[int]:
    return [sim.post("/v1/completions", completion("hi", max_tokens=1))[0] for _ in range(n)]


def faults(sim: SimProc, doc: dict[str, object]) -> tuple[int, dict[str, object]]:
    status, _, body = request(f"{sim.url}/sim/faults", orjson.dumps(doc))
    answer: dict[str, object] = orjson.loads(body)
    return status, answer


def test_a_seeded_share_of_requests_fails_the_same_way_twice(tmp_path: Path) -> None:
    args = ["--time-scale", "0", "--fault-status", "503:0.3,404:0.2", "--fault-seed", "11"]
    with sims(tmp_path, args, args) as (a, b):
        seen = statuses(a, 60)
        assert seen == statuses(b, 60)
        assert {200, 503, 404} == set(seen)
        status, body = a.post("/v1/completions", completion("hi"))
        while status == 200:
            status, body = a.post("/v1/completions", completion("hi"))
        error = orjson.loads(body)["error"]
        assert error["message"].startswith("injected fault") and error["code"] == status
        assert faults(a, {})[0] == 400


def test_faults_change_at_runtime(tmp_path: Path) -> None:
    with sims(tmp_path, ["--time-scale", "0"]) as (sim,):
        assert set(statuses(sim, 5)) == {200}
        status, now = faults(sim, {"status": "429:1"})
        assert status == 200 and now["status"] == "429:1" and now["metrics"] == "ok"
        assert set(statuses(sim, 5)) == {429}
        assert faults(sim, {"status": "", "metrics": "fail"})[1]["metrics_down"] is True
        assert set(statuses(sim, 5)) == {200}
        assert request(f"{sim.url}/metrics")[0] == 503
        assert faults(sim, {"metrics": "slow:0.3"})[0] == 200
        started = time.monotonic()
        assert request(f"{sim.url}/metrics")[0] == 200
        assert time.monotonic() - started >= 0.3
        assert faults(sim, {"metrics": "slow"})[0] == 400
        assert faults(sim, {"status": "200:1"})[0] == 400


def test_metrics_fail_from_the_start(tmp_path: Path) -> None:
    with sims(tmp_path, ["--fault-metrics", "fail"]) as (sim,):
        assert request(f"{sim.url}/metrics")[0] == 503
        assert faults(sim, {"metrics": "ok"})[1]["metrics"] == "ok"
        assert request(f"{sim.url}/metrics")[0] == 200
