"""The simulated engine: timing formulas, FIFO admission, KV accounting, prefix hits."""

from __future__ import annotations

import asyncio
from contextlib import aclosing
from dataclasses import replace

import orjson
import pytest

from epp_harness.sim.config import SimConfig
from epp_harness.sim.engine import (
    Engine,
    PromptReport,
    blocks_for,
    first_token_seconds,
    itl_seconds,
    kv_usage,
    prefill_seconds,
)
from epp_harness.sim.protocol import ApiKind, GenerationRequest, parse_request
from epp_harness.sim.responses import token_id

CONFIG = SimConfig(
    prefill_overhead_ms=5,
    prefill_ms_per_token=0.05,
    decode_ms_per_token=8,
    itl_ms_per_running_seq=0.5,
    time_scale=1.0,
    max_num_batched_tokens=0,  # per-request timing (test_steps.py checks the steps)
)


def token_request(ids: list[int], max_tokens: int) -> GenerationRequest:
    body = {"model": CONFIG.model, "prompt": ids, "max_tokens": max_tokens}
    return parse_request(
        ApiKind.COMPLETION, orjson.dumps(body), served_model=CONFIG.model, default_max_tokens=16
    )


def request(prompt: str, max_tokens: int = 4) -> GenerationRequest:
    body = {"model": CONFIG.model, "prompt": prompt, "max_tokens": max_tokens}
    return parse_request(
        ApiKind.COMPLETION, orjson.dumps(body), served_model=CONFIG.model, default_max_tokens=16
    )


class FakeTime:
    """A clock that only moves when the engine sleeps."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_timing_formulas() -> None:
    assert prefill_seconds(CONFIG, 0) == pytest.approx(0.005)
    assert prefill_seconds(CONFIG, 1000) == pytest.approx(0.055)
    assert itl_seconds(CONFIG, 1) == pytest.approx(0.0085)
    assert itl_seconds(CONFIG, 10) == pytest.approx(0.013)
    half = replace(CONFIG, time_scale=0.5)
    assert prefill_seconds(half, 1000) == pytest.approx(0.0275)
    assert itl_seconds(half, 10) == pytest.approx(0.0065)
    instant = replace(CONFIG, time_scale=0)
    assert prefill_seconds(instant, 10**6) == 0 and itl_seconds(instant, 100) == 0


def test_first_token_formula_for_received_kv() -> None:
    transfer = 0.005 / 1000  # kv_transfer_ms_per_token default, in seconds per token
    # nothing received: the plain prefill of the uncached part
    assert first_token_seconds(CONFIG, 1000, 200, 0) == pytest.approx(prefill_seconds(CONFIG, 800))
    # all received: a transfer per token, no prefill overhead
    assert first_token_seconds(CONFIG, 1000, 0, 1000) == pytest.approx(1000 * transfer)
    # what the local cache holds is not transferred again
    assert first_token_seconds(CONFIG, 1000, 600, 1000) == pytest.approx(400 * transfer)
    assert first_token_seconds(CONFIG, 1000, 1000, 1000) == 0
    # part received: transfer it, prefill the rest
    assert first_token_seconds(CONFIG, 1000, 0, 700) == pytest.approx(
        700 * transfer + prefill_seconds(CONFIG, 300)
    )
    assert first_token_seconds(replace(CONFIG, time_scale=0), 1000, 0, 1000) == 0


def test_block_and_usage_formulas() -> None:
    assert [blocks_for(t, 16) for t in (0, 1, 16, 17, 32)] == [0, 1, 1, 2, 2]
    assert kv_usage(0, 8) == 0 and kv_usage(4, 8) == 0.5 and kv_usage(80, 8) == 1.0


def test_invalid_config_is_rejected() -> None:
    for bad in ({"max_num_seqs": 0}, {"time_scale": -1.0}, {"kv_blocks": 1}, {"port": 70000}):
        with pytest.raises(ValueError):
            replace(CONFIG, **bad)


async def run(engine: Engine, req: GenerationRequest) -> list[int]:
    async with aclosing(engine.generate(req)) as tokens:
        return [i async for i in tokens]


async def test_one_request_timing_counters_and_release() -> None:
    fake, ttfts = FakeTime(), list[float]()
    engine = Engine(CONFIG, clock=fake.clock, sleep=fake.sleep, on_first_token=ttfts.append)
    req = request("x" * 400, max_tokens=3)  # 100 tokens
    assert await run(engine, req) == [0, 1, 2]
    assert ttfts == [pytest.approx(0.005 + 0.05 * 100 / 1000)]
    assert fake.sleeps[1:] == [pytest.approx(0.0085)] * 2
    c = engine.counters
    assert (c.requests_total, c.request_success_total) == (1, 1)
    assert (c.prompt_tokens_total, c.generation_tokens_total) == (100, 3)
    assert (c.prefix_cache_queries_tokens, c.prefix_cache_hits_tokens) == (100, 0)
    assert (engine.running, engine.waiting, engine.kv_blocks_used) == (0, 0, 0)


async def test_repeated_prompt_hits_the_prefix_cache_and_prefills_faster() -> None:
    fake, ttfts = FakeTime(), list[float]()
    engine = Engine(CONFIG, clock=fake.clock, sleep=fake.sleep, on_first_token=ttfts.append)
    prompt = "p" * 4000  # 1000 tokens = 62.5 blocks: 62 full blocks can be cached
    await run(engine, request(prompt, 1))
    await run(engine, request(prompt, 1))
    assert engine.counters.prefix_cache_hits_tokens == 62 * 16
    assert ttfts[1] == pytest.approx(0.005 + 0.05 * (1000 - 992) / 1000)
    assert ttfts[1] < ttfts[0]


async def test_time_scale_zero_never_sleeps() -> None:
    fake = FakeTime()
    engine = Engine(replace(CONFIG, time_scale=0), clock=fake.clock, sleep=fake.sleep)
    assert len(await run(engine, request("x" * 1000, 20))) == 20
    assert fake.sleeps == []
    assert engine.counters.generation_tokens_total == 20


async def test_kv_blocks_are_held_while_running() -> None:
    config = replace(CONFIG, time_scale=0, kv_blocks=11)  # 10 usable, one reserved
    engine = Engine(config)
    async with aclosing(engine.generate(request("k" * 4 * 30, 10))) as tokens:
        assert await anext(tokens) == 0  # 30 prompt tokens computed = 2 blocks
        assert engine.kv_blocks_used == 2 and engine.kv_cache_usage == pytest.approx(0.2)
        for _ in range(3):
            await anext(tokens)  # token 4 out: 33 tokens computed, a third block
        assert engine.kv_blocks_used == 3
        assert engine.kv.pool.num_cached == 2  # the full prompt block, then 16-31
    assert engine.kv_blocks_used == 0 and engine.running == 0
    assert engine.kv.pool.num_cached == 2  # a finished request's full blocks stay cached


async def test_generated_tokens_fill_cached_blocks_and_a_next_turn_hits_them() -> None:
    engine = Engine(replace(CONFIG, time_scale=0, kv_blocks=20))
    ids = list(range(40))
    await run(engine, token_request(ids, 25))  # 40 + 24 computed = 64 tokens: 4 blocks
    assert engine.kv.pool.num_cached == 4
    turn = ids + [token_id(i) for i in range(25)] + [7] * 10
    report = PromptReport()
    async with aclosing(engine.generate(token_request(turn, 1), report=report)) as tokens:
        assert [i async for i in tokens] == [0]
    assert report.cached_tokens == 64


async def test_admission_is_fifo_and_bounded() -> None:
    engine = Engine(replace(CONFIG, time_scale=0, max_num_seqs=1))
    order: list[str] = []

    async def client(name: str) -> None:
        async with aclosing(engine.generate(request(name, 1))) as tokens:
            async for _ in tokens:
                order.append(name)

    first = engine.generate(request("first", 2))
    assert await anext(first) == 0  # holds the only slot
    tasks = [asyncio.create_task(client(n)) for n in ("a", "b", "c")]
    await asyncio.sleep(0)
    assert (engine.running, engine.waiting) == (1, 3)
    await first.aclose()  # frees the slot mid-generation (as on a disconnect)
    await asyncio.gather(*tasks)
    assert order == ["a", "b", "c"]
    assert (engine.running, engine.waiting) == (0, 0)


async def test_cancelled_waiter_leaves_the_queue() -> None:
    engine = Engine(replace(CONFIG, time_scale=0, max_num_seqs=1))
    holder = engine.generate(request("h", 2))
    await anext(holder)
    waiter = asyncio.create_task(run(engine, request("w", 1)))
    await asyncio.sleep(0)
    assert engine.waiting == 1
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert engine.waiting == 0
    await holder.aclose()
    assert engine.running == 0
    assert await run(engine, request("next", 1)) == [0]


async def test_received_kv_replaces_the_prefill_and_ttft_counts_from_arrival() -> None:
    fake, ttfts = FakeTime(), list[float]()
    engine = Engine(CONFIG, clock=fake.clock, sleep=fake.sleep, on_first_token=ttfts.append)
    arrival = engine.now()
    fake.now += 0.25  # the handoff took this long before the engine saw the request
    req = request("r" * 4000, 1)  # 1000 tokens
    assert await run_received(engine, req, 1000, arrival) == [0]
    assert fake.sleeps == [pytest.approx(1000 * 0.005 / 1000)]
    assert ttfts == [pytest.approx(0.25 + 0.005)]
    # the received prompt is now cached here
    assert engine.counters.prefix_cache_hits_tokens == 0
    await run(engine, request("r" * 4000, 1))
    assert engine.counters.prefix_cache_hits_tokens == 62 * 16


async def run_received(
    engine: Engine, req: GenerationRequest, received: int, arrival: float
) -> list[int]:
    async with aclosing(engine.generate(req, received_tokens=received, arrival=arrival)) as tokens:
        return [i async for i in tokens]


async def test_held_blocks_count_as_used_and_squeeze_the_cache() -> None:
    engine = Engine(replace(CONFIG, time_scale=0, kv_blocks=21))  # 20 usable
    await run(engine, request("h" * 64 * 6, 1))
    assert engine.kv.pool.num_cached == 6
    held = engine.hold_blocks(17)  # 14 never-used blocks first, then 3 cached ones
    assert engine.kv_blocks_used == 17 and engine.kv_cache_usage == pytest.approx(0.85)
    assert engine.kv.pool.num_cached == 3
    engine.release_blocks(held)
    assert engine.kv_blocks_used == 0


async def test_report_counts_cached_and_received_prompt_tokens() -> None:
    fake = FakeTime()
    engine = Engine(CONFIG, clock=fake.clock, sleep=fake.sleep)
    prompt = "c" * 4000  # 1000 tokens: 62 full blocks = 992 tokens can be cached

    async def cached(received: int = 0) -> int:
        report = PromptReport()
        gen = engine.generate(request(prompt, 1), received_tokens=received, report=report)
        async with aclosing(gen) as tokens:
            assert [i async for i in tokens] == [0]
        return report.cached_tokens

    assert await cached() == 0  # cold
    assert await cached() == 992  # the prefix cache's full blocks
    assert await cached(received=5000) == 1000  # KV received for the whole prompt (capped)
