"""The simulator's prefix cache against a real vLLM's, block for block: one vLLM and one
``epp sim`` with the same geometry (128-token blocks, 24 blocks) get the same seeded
traces one request at a time, and report the same ``cached_tokens`` for (nearly) every
request. A concurrent trace is reported beside them, not asserted (batch timing
differs)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import orjson
import pytest

from tests.support.http import metric_sum, request
from tests.support.sim import SimProc, sims
from tests.vllm.cache_trace import Replay, Step, make_trace
from tests.vllm.servers import MODEL_NAME, VllmServer, log, vllm_servers

pytestmark = pytest.mark.e2e

BLOCK_SIZE = 128
BLOCKS = 24  # vLLM's --num-gpu-blocks-override; one is its null block
SIM_MODEL = "sim-model"
REQUESTS = 150  # per sequential trace: ~30 s each on two busy cores


@dataclass
class Pair:
    vllm: VllmServer
    sim: SimProc


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    workdir = tmp_path_factory.mktemp("cache-fidelity")
    geometry = ["--block-size", str(BLOCK_SIZE), "--num-gpu-blocks-override", str(BLOCKS)]
    sim_args = [
        "--block-size", str(BLOCK_SIZE), "--kv-blocks", str(BLOCKS),
        "--enable-prompt-tokens-details", "--max-num-seqs", "8", "--time-scale", "0.1",
    ]  # fmt: skip
    with (
        vllm_servers(workdir, [("vllm-cache", geometry, {})]) as (server,),
        sims(workdir, sim_args) as (sim,),
    ):
        yield Pair(server, sim)


def complete(url: str, model: str, prompt: list[int], max_tokens: int) -> tuple[int, list[int]]:
    """One completion: (cached_tokens, the output's token ids)."""
    doc = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    status, _, body = request(f"{url}/v1/completions", orjson.dumps(doc), timeout=300)
    assert status == 200, body[:500]
    answer: dict[str, Any] = orjson.loads(body)
    # both report the details on every request, a cold one's as {"cached_tokens": 0}
    details = answer["usage"]["prompt_tokens_details"]
    assert isinstance(details, dict) and isinstance(details["cached_tokens"], int), answer
    output = answer["choices"][0]["token_ids"]
    assert len(output) == max_tokens
    return details["cached_tokens"], list(output)


def reset(pair: Pair) -> None:
    for url in (pair.vllm.url, pair.sim.url):
        status, _, _ = request(f"{url}/reset_prefix_cache", b"")
        assert status == 200


def replay(pair: Pair, trace: list[Step]) -> list[tuple[Step, int, int, int]]:
    """Each step to vLLM, then the same to the simulator: (step, prompt length, vLLM's
    cached tokens, the simulator's)."""
    mine, theirs = Replay(), Replay()
    rows = []
    for step in trace:
        prompt = theirs.prompt(step)
        cached_v, out_v = complete(pair.vllm.url, MODEL_NAME, prompt, step.max_tokens)
        theirs.record(prompt, out_v)
        sim_prompt = mine.prompt(step)
        cached_s, out_s = complete(pair.sim.url, SIM_MODEL, sim_prompt, step.max_tokens)
        mine.record(sim_prompt, out_s)
        rows.append((step, len(prompt), cached_v, cached_s))
    return rows


def report(name: str, rows: list[tuple[Step, int, int, int]]) -> tuple[float, int, int]:
    """Print the agreement and every disagreement; returns (agreement, vLLM total,
    simulator total)."""
    agree = sum(v == s for _, _, v, s in rows)
    total_v = sum(v for _, _, v, _ in rows)
    total_s = sum(s for _, _, _, s in rows)
    share = agree / len(rows)
    log(
        f"{name}: cached_tokens agree on {agree}/{len(rows)} requests ({share:.1%}); "
        f"total cached vLLM {total_v}, simulator {total_s}"
    )
    for i, (step, length, v, s) in enumerate(rows):
        if v != s:
            where = f"#{i} {step.kind} prompt {length} out {step.max_tokens}"
            log(f"  {name} {where}: vLLM {v} sim {s}")
    return share, total_v, total_s


@pytest.mark.parametrize(("name", "seed", "zipf"), [("equal", 11, 0.0), ("zipf", 12, 1.2)])
def test_one_at_a_time_the_simulator_caches_as_vllm_does(
    pair: Pair, name: str, seed: int, zipf: float
) -> None:
    reset(pair)
    before = counters(pair)
    rows = replay(pair, make_trace(seed, REQUESTS, zipf=zipf, block_size=BLOCK_SIZE))
    share, total_v, total_s = report(name, rows)
    assert share >= 0.99
    assert abs(total_s - total_v) <= 0.01 * total_v
    # the counters say what the responses said, on both servers
    after = counters(pair)
    queries = sum(length for _, length, _, _ in rows)
    assert after["sim"][0] - before["sim"][0] == total_s
    assert after["sim"][1] - before["sim"][1] == queries
    assert after["vllm"][0] - before["vllm"][0] == total_v
    assert after["vllm"][1] - before["vllm"][1] == queries


def counters(pair: Pair) -> dict[str, tuple[float, float]]:
    """Each server's (prefix_cache_hits_total, prefix_cache_queries_total)."""
    sim_text = request(f"{pair.sim.url}/metrics")[2].decode()
    found = {}
    for name, text in (("vllm", pair.vllm.metrics()), ("sim", sim_text)):
        hits = metric_sum(text, "vllm:prefix_cache_hits_total")
        found[name] = (hits, metric_sum(text, "vllm:prefix_cache_queries_total"))
    return found


def test_a_concurrent_trace_is_reported(pair: Pair) -> None:
    """Four requests at a time, no next turns (they need an answer first): printed only,
    as vLLM's batch timing (which request is scheduled in which step) is not modelled."""
    reset(pair)
    trace = make_trace(13, 60, turns=0.0, block_size=BLOCK_SIZE)
    prompts = Replay()
    for step in trace:
        prompts.record(prompts.prompt(step), [])

    def run(url: str, model: str) -> list[int]:
        def one(i: int) -> int:
            return complete(url, model, prompts.prompts[i], trace[i].max_tokens)[0]

        with ThreadPoolExecutor(4) as pool:
            return list(pool.map(one, range(len(trace))))

    cached_v = run(pair.vllm.url, MODEL_NAME)
    cached_s = run(pair.sim.url, SIM_MODEL)
    rows = [
        (s, len(p), v, c)
        for s, p, v, c in zip(trace, prompts.prompts, cached_v, cached_s, strict=True)
    ]
    report("concurrent (not asserted)", rows)
