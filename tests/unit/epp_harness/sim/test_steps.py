"""Step-level batching: decode-first chunked prefill, the step's roofline time, and the
interference a prefill in a step puts on the decodes beside it."""

from __future__ import annotations

import asyncio
import itertools
from contextlib import aclosing
from dataclasses import replace

import orjson
import pytest

from epp_harness.sim.config import SimConfig
from epp_harness.sim.engine import Engine, transfer_seconds
from epp_harness.sim.protocol import ApiKind, GenerationRequest, parse_request
from epp_harness.sim.steps import Work, compose, interference_seconds, step_seconds

CONFIG = SimConfig(
    prefill_overhead_ms=5,
    prefill_ms_per_token=0.05,
    decode_ms_per_token=8,
    itl_ms_per_running_seq=0.5,
    max_num_batched_tokens=2048,
    time_scale=1.0,
)


def request(tokens: int, max_tokens: int) -> GenerationRequest:
    body = {"model": CONFIG.model, "prompt": "x" * 4 * tokens, "max_tokens": max_tokens}
    return parse_request(
        ApiKind.COMPLETION, orjson.dumps(body), served_model=CONFIG.model, default_max_tokens=16
    )


class SteppedTime:
    """A clock that moves only when the engine sleeps; each sleep lets the other tasks
    run first, so a token is seen at the time of the step that made it."""

    def __init__(self) -> None:
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(0)
        self.now += seconds


def test_decodes_go_first_then_prefills_in_arrival_order_chunked_to_the_budget() -> None:
    long = Work(to_prefill=5000, outputs=4, overhead=True)
    decoding = Work(to_prefill=0, outputs=4, overhead=False)
    short = Work(to_prefill=100, outputs=4, overhead=True)
    step = compose([long, decoding, short], 2048)
    assert [(w, n) for w, n in step.entries] == [(decoding, 1), (long, 2047)]
    assert (step.decodes, step.prefill_tokens, step.prefill_starts) == (1, 2047, 1)
    for work, tokens in step.entries:
        work.advance(tokens)
    assert long.to_prefill == 2953 and not long.overhead and long.produced == 0
    assert decoding.produced == 1
    # the last chunk of a prompt makes its first token; what is left goes to the next one
    long.to_prefill = 1000
    step = compose([long, decoding, short], 2048)
    assert [n for _, n in step.entries] == [1, 1000, 100]
    for work, tokens in step.entries:
        work.advance(tokens)
    assert (long.produced, short.produced, decoding.produced) == (1, 1, 2)


def test_a_prefill_in_the_step_lengthens_the_itl_of_its_decodes_by_the_configured_amount() -> None:
    # 8 decodes alone: the weights and their KV, 8 + 0.5 x 8 = 12 ms
    assert step_seconds(CONFIG, 8, 0) == pytest.approx(0.012)
    # a small chunk rides along free: 0.05 x (100 + 8) = 5.4 ms of compute < 12 ms
    assert interference_seconds(CONFIG, 8, 100) == 0
    # a full chunk: 0.05 ms x 2048 tokens = 102.4 ms, 90.4 ms more for every decode
    assert step_seconds(CONFIG, 8, 2040) == pytest.approx(0.1024)
    assert interference_seconds(CONFIG, 8, 2040) == pytest.approx(0.0904)
    # the configured per-token cost sets the amount; a starting prefill adds its overhead
    doubled = replace(CONFIG, prefill_ms_per_token=0.1)
    assert interference_seconds(doubled, 8, 2040) == pytest.approx(0.2048 - 0.012)
    assert step_seconds(CONFIG, 8, 2040, starts=1) == pytest.approx(0.1074)
    assert step_seconds(replace(CONFIG, time_scale=0.5), 8, 0) == pytest.approx(0.006)


def test_budget_below_max_num_seqs_is_rejected() -> None:
    with pytest.raises(ValueError, match="max_num_seqs"):
        replace(CONFIG, max_num_batched_tokens=8)
    with pytest.raises(ValueError, match=">= 0"):
        replace(CONFIG, max_num_batched_tokens=-1)
    assert replace(CONFIG, max_num_batched_tokens=0).max_num_batched_tokens == 0


async def token_times(engine: Engine, req: GenerationRequest, received: int = 0) -> list[float]:
    times = []
    async with aclosing(engine.generate(req, received_tokens=received)) as tokens:
        async for _ in tokens:
            times.append(engine.now())
    return times


async def test_a_long_prompt_stalls_the_running_decode_for_its_chunks() -> None:
    fake = SteppedTime()
    engine = Engine(CONFIG, clock=fake.clock, sleep=fake.sleep)
    decode = asyncio.create_task(token_times(engine, request(10, 40)))
    for _ in range(20):  # let the first request prefill and decode a few tokens
        await asyncio.sleep(0)
    prefill = asyncio.create_task(token_times(engine, request(4096, 2)))
    times, long_times = await decode, await prefill
    gaps = [b - a for a, b in itertools.pairwise(times)]
    alone = step_seconds(CONFIG, 1, 0)
    first_chunk = step_seconds(CONFIG, 1, 2047, starts=1)
    assert gaps[0] == pytest.approx(alone)
    # the 4096-token prompt: chunks of 2047, 2047 and 2 tokens beside the decode
    assert pytest.approx(first_chunk) in gaps
    assert pytest.approx(step_seconds(CONFIG, 1, 2047)) in gaps
    assert max(gaps) == pytest.approx(first_chunk)
    assert gaps[-1] == pytest.approx(alone)
    assert len(long_times) == 2
    assert engine.steps is not None and engine.running == 0


async def test_received_kv_costs_its_transfer_and_one_step_not_a_prefill() -> None:
    fake = SteppedTime()
    engine = Engine(CONFIG, clock=fake.clock, sleep=fake.sleep)
    times = await token_times(engine, request(4096, 2), received=4096)
    expected = transfer_seconds(CONFIG, 4096) + step_seconds(CONFIG, 0, 1)
    assert times[0] == pytest.approx(expected)
    assert times[1] - times[0] == pytest.approx(step_seconds(CONFIG, 1, 0))


async def test_time_scale_zero_answers_without_sleeping() -> None:
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    engine = Engine(replace(CONFIG, time_scale=0), sleep=sleep)
    reqs = [request(3000, 5), request(10, 7)]
    results = await asyncio.gather(*(token_times(engine, r) for r in reqs))
    assert [len(r) for r in results] == [5, 7] and slept == []
    assert engine.counters.generation_tokens_total == 12
