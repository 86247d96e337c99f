"""The virtual-time event loop: timers jump the clock, nothing sleeps for real."""

from __future__ import annotations

import asyncio
import time

import pytest

from bench.virtualtime import START, Deadlock, run_virtual


def test_sleeps_take_no_wall_time_and_fire_in_order() -> None:
    seen: list[tuple[str, float]] = []

    async def sleeper(name: str, delay: float) -> None:
        await asyncio.sleep(delay)
        seen.append((name, asyncio.get_running_loop().time()))

    async def main() -> float:
        loop = asyncio.get_running_loop()
        assert loop.time() == START
        await asyncio.gather(sleeper("late", 3600.0), sleeper("early", 0.25), sleeper("mid", 60))
        return loop.time()

    began = time.monotonic()
    end = run_virtual(main())
    assert time.monotonic() - began < 5.0  # an hour of virtual time
    assert [name for name, _ in seen] == ["early", "mid", "late"]
    assert [t - START for _, t in seen] == pytest.approx([0.25, 60.0, 3600.0])
    assert end - START == pytest.approx(3600.0)


def test_wait_for_times_out_on_the_virtual_clock() -> None:
    async def main() -> float:
        loop = asyncio.get_running_loop()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.sleep(10.0), timeout=2.0)
        return loop.time() - START

    assert run_virtual(main()) == pytest.approx(2.0)


def test_a_wait_nothing_can_end_is_a_deadlock() -> None:
    async def main() -> None:
        await asyncio.get_running_loop().create_future()

    with pytest.raises(Deadlock):
        run_virtual(main())
