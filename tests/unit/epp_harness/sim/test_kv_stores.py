"""Where handed-off KV waits: a NIXL prefill's held blocks, SGLang bootstrap rooms, and
the directory pool shared between processes."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest

from epp_harness.sim.bootstrap import Rooms
from epp_harness.sim.config import KvConnector, SimConfig
from epp_harness.sim.engine import Engine
from epp_harness.sim.kv_holds import KvHolds
from epp_harness.sim.kv_pool import KvPool
from epp_harness.sim.prefix_cache import text_block_hashes
from epp_harness.sim.protocol import SimError
from tests.support.wait import until

CONFIG = SimConfig(time_scale=0, kv_blocks=100, block_size=16)


# -- held blocks (NIXL) ----------------------------------------------------------------


async def test_held_blocks_are_taken_once() -> None:
    engine = Engine(CONFIG)
    holds = KvHolds(engine, hold_seconds=60)
    ids = holds.hold(40)  # 40 tokens: 3 blocks
    assert len(ids) == 3 and holds.blocks_held == 3 and engine.kv_blocks_used == 3
    other = holds.hold(10)
    assert set(ids).isdisjoint(other)
    assert holds.take(ids) == 40
    assert holds.take(ids) is None  # pulled already
    assert holds.blocks_held == 1 and engine.kv_blocks_used == 1
    holds.close()
    assert holds.blocks_held == 0 and engine.kv_blocks_used == 0


async def test_a_take_must_name_blocks_of_one_prefill() -> None:
    holds = KvHolds(Engine(CONFIG), hold_seconds=60)
    a, b = holds.hold(16), holds.hold(16)
    assert holds.take([a[0], b[0]]) is None
    assert holds.take([a[0], 12345]) is None
    assert holds.take([]) is None
    assert holds.take(a) == 16 and holds.take(b) == 16
    holds.close()


async def test_held_blocks_are_freed_after_the_hold_time() -> None:
    engine = Engine(CONFIG)
    holds = KvHolds(engine, hold_seconds=0)
    ids = holds.hold(20)
    await until(lambda: holds.blocks_held == 0, what="the hold to expire")
    assert engine.kv_blocks_used == 0 and holds.take(ids) is None


# -- bootstrap rooms (SGLang / Mooncake) -----------------------------------------------


async def test_prefill_waits_for_the_decode_then_hands_over() -> None:
    rooms = Rooms()

    async def prefill() -> None:
        with rooms.prefill(5) as side:
            await side.wait_for_decode(5)
            side.hand_over(321)

    leg = asyncio.create_task(prefill())
    await until(lambda: len(rooms) == 1, what="the prefill's room")
    assert await rooms.join(5, 5) == 321
    await leg
    assert len(rooms) == 0


async def test_decode_may_join_before_the_prefill_arrives() -> None:
    rooms = Rooms()
    joined = asyncio.create_task(rooms.join(6, 5))
    await until(lambda: len(rooms) == 1, what="the decode's room")
    with rooms.prefill(6) as side:
        await side.wait_for_decode(0)  # already joined: no wait
        side.hand_over(9)
    assert await joined == 9 and len(rooms) == 0


async def test_prefill_alone_times_out_naming_the_room() -> None:
    rooms = Rooms()
    with pytest.raises(SimError) as info, rooms.prefill(7) as side:
        await side.wait_for_decode(0.01)
    assert info.value.status == 504 and "bootstrap room 7" in info.value.message
    assert len(rooms) == 0


async def test_decode_alone_times_out_naming_the_room() -> None:
    rooms = Rooms()
    with pytest.raises(SimError) as info:
        await rooms.join(8, 0.01)
    assert info.value.status == 504 and "bootstrap room 8" in info.value.message
    assert len(rooms) == 0


async def test_an_aborted_prefill_fails_the_decode_at_once() -> None:
    rooms = Rooms()
    joined = asyncio.create_task(rooms.join(9, 60))
    await until(lambda: len(rooms) == 1, what="the decode's room")
    with rooms.prefill(9) as side:
        await side.wait_for_decode(1)
        # leaves without handing over (a client that went away mid-prefill)
    with pytest.raises(SimError) as info:
        await joined
    assert info.value.status == 500 and "aborted" in info.value.message


async def test_a_room_takes_one_decode() -> None:
    rooms = Rooms()
    first = asyncio.create_task(rooms.join(10, 60))
    await until(lambda: len(rooms) == 1, what="the first decode")
    with pytest.raises(SimError) as info:
        await rooms.join(10, 60)
    assert info.value.status == 409
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    assert len(rooms) == 0


# -- the directory pool ----------------------------------------------------------------


async def test_pool_is_shared_through_the_directory(tmp_path: Path) -> None:
    hashes = text_block_hashes("a" * 64 * 5, 64)
    writer = KvPool(str(tmp_path), "m", 16)
    reader = KvPool(str(tmp_path), "m", 16)  # as another process would open it
    assert await reader.match(hashes) == 0  # nothing yet (the directory does not exist)
    assert await writer.add(hashes[:3]) == 3
    assert await reader.match(hashes) == 3
    assert await writer.add(hashes) == 2  # only the new blocks
    assert await reader.match(hashes) == 5
    # a gap ends the match: the later blocks stand for prefixes that are not all there
    other = text_block_hashes("b" * 64 * 2, 64)
    assert await reader.match(other) == 0


async def test_pool_separates_models_and_block_sizes(tmp_path: Path) -> None:
    hashes = text_block_hashes("c" * 64 * 2, 64)
    await KvPool(str(tmp_path), "m", 16).add(hashes)
    assert await KvPool(str(tmp_path), "other", 16).match(hashes) == 0
    assert await KvPool(str(tmp_path), "m", 32).match(hashes) == 0


def test_config_rules_for_the_connectors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--kv-pool-dir"):
        replace(CONFIG, kv_connector=KvConnector.POOL)
    with pytest.raises(ValueError, match="only applies to kv_connector pool"):
        replace(CONFIG, kv_pool_dir=str(tmp_path))
    with pytest.raises(ValueError, match="sglang or mooncake"):
        replace(CONFIG, bootstrap_port=0)
    assert replace(CONFIG, kv_connector=KvConnector.MOONCAKE, bootstrap_port=0).bootstrap_port == 0
    with pytest.raises(ValueError, match="bootstrap_timeout_seconds"):
        replace(CONFIG, bootstrap_timeout_seconds=float("nan"))
