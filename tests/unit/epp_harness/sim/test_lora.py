"""The simulator's LoRA slot table: hits, free slots, LRU eviction with its swap cost,
waiting when every slot is busy, and the lora_requests_info series it keeps."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import pytest

from epp_harness.sim.lora import LoraSlots, parse_lora_module
from epp_harness.sim.protocol import SimError


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def wall(self) -> float:
        self.now += 1.0
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)


async def tokens(gate: asyncio.Event | None = None) -> AsyncGenerator[int, None]:
    yield 0
    if gate is not None:
        await gate.wait()
    yield 1


async def run(slots: LoraSlots, name: str, gate: asyncio.Event | None = None) -> int:
    return len([i async for i in slots.hold(name, tokens(gate))])


def make(max_loras: int, *names: str, swap: float = 0.5) -> tuple[LoraSlots, Clock]:
    clock = Clock()
    modules = [(n, f"/adapters/{n}") for n in names]
    slots = LoraSlots(
        max_loras, modules, swap_seconds=swap, sleep=clock.sleep, wall_clock=clock.wall
    )
    return slots, clock


def test_parse_lora_module() -> None:
    assert parse_lora_module("sql=/a/b=c") == ("sql", "/a/b=c")
    for bad in ("sql", "=path", "sql=", " = "):
        with pytest.raises(ValueError, match="name=path"):
            parse_lora_module(bad)


async def test_free_slots_cost_nothing_and_a_full_table_swaps_the_lru_idle_one() -> None:
    slots, clock = make(2, "a", "b", "c")
    assert await run(slots, "a") == 2
    await run(slots, "b")
    await run(slots, "a")  # a is now the most recently used
    assert clock.slept == [] and slots.active == ("b", "a")
    await run(slots, "c")  # full: evicts b, the least recently used
    assert clock.slept == [0.5] and slots.active == ("a", "c") and slots.swaps == 1
    await run(slots, "c")  # already active: no cost
    assert clock.slept == [0.5]


async def test_a_request_waits_while_every_slot_is_busy_with_other_adapters() -> None:
    slots, _ = make(1, "a", "b")
    gate = asyncio.Event()
    first = asyncio.create_task(run(slots, "a", gate))
    await asyncio.sleep(0)
    second = asyncio.create_task(run(slots, "b"))
    await asyncio.sleep(0)
    assert slots.running == ["a"] and slots.waiting == ["b"] and slots.waiting_requests == 1
    series = {(r, w) for r, w, _ in slots.info_series()}
    assert ("a", "b") in series
    gate.set()
    assert await first == 2 and await second == 2
    assert slots.running == [] and slots.waiting == [] and slots.active == ("b",)


async def test_a_cancelled_waiter_leaves_no_trace() -> None:
    slots, _ = make(1, "a", "b")
    gate = asyncio.Event()
    first = asyncio.create_task(run(slots, "a", gate))
    await asyncio.sleep(0)
    second = asyncio.create_task(run(slots, "b"))
    await asyncio.sleep(0)
    second.cancel()
    with pytest.raises(asyncio.CancelledError):
        await second
    assert slots.waiting == []
    gate.set()
    await first
    assert slots.active == ("a",) and slots.running == []


async def test_info_series_keeps_old_label_sets_and_stamps_the_current_newest() -> None:
    slots, _ = make(2, "a")
    await run(slots, "a")
    series = slots.info_series()
    labels = [(r, w) for r, w, _ in series]
    assert labels == [("", ""), ("", "a"), ("a", "")]  # idle, queued, running, idle
    newest = max(series, key=lambda s: s[2])
    assert (newest[0], newest[1]) == ("", "")  # idle now: the current state is newest
    assert len({at for _, _, at in series}) == len(series)


def test_load_and_unload_errors_are_vllms() -> None:
    slots, _ = make(1, "a")
    with pytest.raises(SimError) as err:
        slots.load("a", "/x")
    assert err.value.status == 400
    assert err.value.body()["error"] == {
        "message": "The lora adapter 'a' has already been loaded.",
        "type": "InvalidUserInput",
        "param": None,
        "code": 400,
    }
    slots.unload("a")
    with pytest.raises(SimError) as err:
        slots.unload("a")
    assert err.value.status == 404
    assert err.value.body()["error"]["type"] == "NotFoundError"
    assert err.value.message == "The lora adapter 'a' cannot be found."
