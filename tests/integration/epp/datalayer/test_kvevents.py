"""KV events end to end without Envoy: real simulators publishing (``--kv-events-port``),
the real subscriber, index and precise scorer in this process.

A few cases need sequences no healthy server sends (a restart, a message that is not a
batch): there the test itself publishes on a real ZMQ socket, frames built with msgspec
as vLLM builds them.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zmq
import zmq.asyncio

from epp.config import build_scheduler
from epp.datalayer.kvevents import KvEventSubscribers, Step, step
from epp.datastore import Datastore
from epp.kvevents.index import PreciseIndex
from epp.kvevents.settings import KvEventsSettings
from epp.scheduling.plugins.precise import PrecisePrefixCacheScorer
from epp.types import Endpoint, InferenceRequest
from epp_harness.sim.tokenizer import write_tokenizer_files
from tests.support.sim import SimProc, sims
from tests.support.wait import until

BS = 16
SIM = ["--block-size", str(BS), "--time-scale", "0", "--kv-events-port", "0"]
PROMPT = "System: answer in one word. " * 10  # 280 bytes: 17 full blocks


def endpoint(sim: SimProc) -> Endpoint:
    labels = {"epp.dev/kv-events": str(sim.proc.info["kv_events_port"])}
    if "kv_events_replay_port" in sim.proc.info:
        labels["epp.dev/kv-events-replay"] = str(sim.proc.info["kv_events_replay_port"])
    return Endpoint("127.0.0.1", sim.port, labels=labels)


async def complete(sim: SimProc, prompt: str) -> None:
    status, body = await asyncio.to_thread(
        sim.post, "/v1/completions", {"model": "sim-model", "prompt": prompt, "max_tokens": 1}
    )
    assert status == 200, body


@pytest.fixture
def two(tmp_path: Path) -> Iterator[list[SimProc]]:
    with sims(tmp_path, [*SIM, "--kv-blocks", "40"], SIM) as procs:
        yield procs


async def follow(
    datastore: Datastore, index: PreciseIndex, *endpoints: Endpoint
) -> KvEventSubscribers:
    subscribers = KvEventSubscribers(datastore, index, KvEventsSettings(port=None))
    for e in endpoints:
        datastore.add(e)
    subscribers.start()
    return subscribers


def trusted(index: PreciseIndex, later: float = 0.0) -> frozenset[str]:
    """The endpoints trusted now (the subscriber's clock), or ``later`` seconds on."""
    return index.trusted(time.monotonic() + later)


async def synced(sim: SimProc, subscribers: KvEventSubscribers, address: str) -> None:
    """Wait until ``address``'s events are trusted. A PUB socket drops what it sends
    before a new subscription reaches it, so probe until a message arrives; if the
    first one seen was not number 0, a cache reset (AllBlocksCleared) settles it."""
    index = subscribers.index
    for i in range(200):
        before = subscribers.counters.messages
        await complete(sim, f"probe {i} " * 4)
        try:
            await until(lambda n=before: subscribers.counters.messages > n, "a probe", within=0.3)
            break
        except AssertionError:
            continue
    if address not in trusted(index):
        assert (await asyncio.to_thread(sim.post, "/reset_prefix_cache", {}))[0] == 200
    await until(lambda: address in trusted(index), f"{address}'s events to be trusted")


def test_sequence_steps() -> None:
    assert step(None, 5, -1) is Step.FIRST
    assert step(5, 5, -1) is Step.NEXT
    assert step(5, 9, -1) is Step.GAP
    assert step(5, 0, -1) is Step.RESTART
    assert step(5, 3, -1) is Step.RESTART  # a new publisher, some of it missed
    assert step(5, 3, 4) is Step.DUPLICATE  # already applied from a replay
    assert step(5, 0, 4) is Step.DUPLICATE


async def test_simulator_events_drive_the_index_and_the_scorer(
    two: list[SimProc], tmp_path: Path
) -> None:
    a, b = two
    tokenizer = write_tokenizer_files(tmp_path / "tok")
    sched = build_scheduler(
        f"plugins:\n- type: precise-prefix-cache-scorer\n  parameters: {{tokenizer: {tokenizer}}}\n"
    )
    scorer = sched.plugins["precise-prefix-cache-scorer"]
    assert isinstance(scorer, PrecisePrefixCacheScorer)
    datastore = Datastore()
    ea, eb = endpoint(a), endpoint(b)
    subscribers = await follow(datastore, scorer.index, ea, eb)
    index = scorer.index
    try:
        await synced(a, subscribers, ea.address)
        await synced(b, subscribers, eb.address)
        full = len(PROMPT.encode()) // BS
        await complete(a, PROMPT)
        await until(lambda: index.blocks(ea.address)[0] >= full, "a's blocks in the index")

        body = {"model": "sim-model", "prompt": PROMPT + "and?"}
        req = InferenceRequest("r", "sim-model", "/v1/completions", body=body)

        def pick() -> str:
            snap = datastore.snapshot()
            return sched.schedule(req, snap, random.Random(0)).primary.address

        assert pick() == ea.address
        # a evicts the prompt (40 blocks of KV, other prompts pushed through); b caches it
        for i in range(3):
            await complete(a, f"filler {i} " * 60)
        await complete(b, PROMPT)
        await until(lambda: index.blocks(eb.address)[0] >= full, "b's blocks in the index")
        await until(lambda: pick() == eb.address, "the pick to follow the prefix to b")
        c = subscribers.counters
        assert c.messages >= 5 and c.gaps == 0 and c.decode_errors == 0
        assert index.stats.removed > 0  # a's evictions arrived as BlockRemoved
    finally:
        await subscribers.stop()


async def test_a_gap_without_replay_falls_back_until_the_cache_is_reset(tmp_path: Path) -> None:
    with sims(tmp_path, SIM) as (sim,):
        index = PreciseIndex(rebuild_s=600)
        e = endpoint(sim)
        subscribers = await follow(Datastore(), index, e)
        try:
            await synced(sim, subscribers, e.address)
            await complete(sim, "first prompt " * 10)
            assert sim.post("/sim/faults", {"kv_events_drop": 1})[0] == 200
            await complete(sim, "second prompt " * 10)  # its message is lost
            await complete(sim, "third prompt " * 10)
            await until(lambda: subscribers.counters.gaps == 1, "the gap")
            assert e.address not in trusted(index)  # approximate until rebuilt
            assert index.blocks(e.address)[0] == len(b"third prompt " * 10) // BS
            cleared = index.stats.cleared
            assert (await asyncio.to_thread(sim.post, "/reset_prefix_cache", {}))[0] == 200
            await until(lambda: e.address in trusted(index), "AllBlocksCleared to rebuild")
            assert index.size() == 0 and index.stats.cleared == cleared + 1
        finally:
            await subscribers.stop()


async def test_a_gap_with_replay_is_filled_and_stays_trusted(tmp_path: Path) -> None:
    with sims(tmp_path, [*SIM, "--kv-events-replay-port", "0"]) as (sim,):
        index = PreciseIndex(rebuild_s=600)
        e = endpoint(sim)
        subscribers = await follow(Datastore(), index, e)
        try:
            await until(lambda: e.address in trusted(index), "the replay at connect")
            prompts = [f"prompt number {i} " * 8 for i in range(3)]
            await complete(sim, prompts[0])
            await until(lambda: subscribers.counters.messages == 1, "the first message")
            assert sim.post("/sim/faults", {"kv_events_drop": 1})[0] == 200
            await complete(sim, prompts[1])
            await complete(sim, prompts[2])
            await until(lambda: subscribers.counters.messages == 3, "the replayed message")
            c = subscribers.counters
            assert c.gaps == 1 and c.replays >= 2 and c.replays_partial == c.replays_failed == 0
            assert e.address in trusted(index)
            expected = sum(len(p.encode()) // BS for p in prompts)
            assert index.blocks(e.address)[0] == expected
        finally:
            await subscribers.stop()


async def test_a_late_subscriber_gets_the_history_by_replay_or_waits(tmp_path: Path) -> None:
    with sims(tmp_path, [*SIM, "--kv-events-replay-port", "0"], SIM) as (replaying, plain):
        for sim in (replaying, plain):
            await complete(sim, "said before anyone listened " * 4)
        index = PreciseIndex(rebuild_s=600)
        er, ep = endpoint(replaying), endpoint(plain)
        subscribers = await follow(Datastore(), index, er, ep)
        try:
            blocks = len(b"said before anyone listened " * 4) // BS
            await until(lambda: index.blocks(er.address)[0] == blocks, "the replayed history")
            assert er.address in trusted(index)
            await complete(plain, "later " * 10)
            await until(lambda: index.blocks(ep.address)[0] > 0, "the plain server's events")
            assert ep.address not in trusted(index)  # its history before us is unknown
            assert ep.address in trusted(index, later=601)
        finally:
            await subscribers.stop()


# -- sequences no healthy server sends, from a publisher in this test -----------------------
class Batch(msgspec.Struct, array_like=True, omit_defaults=True):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


def stored(first_hash: int, tokens: list[int]) -> dict[str, Any]:
    n = len(tokens) // 4
    return {
        "type": "BlockStored",
        "block_hashes": list(range(first_hash, first_hash + n)),
        "parent_block_hash": None,
        "token_ids": tokens,
        "block_size": 4,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
    }


@pytest.fixture
async def publisher() -> AsyncIterator[tuple[zmq.asyncio.Socket, int]]:
    context = zmq.asyncio.Context()
    xpub = context.socket(zmq.XPUB)  # XPUB: we see the subscription arrive
    port = xpub.bind_to_random_port("tcp://127.0.0.1")
    try:
        yield xpub, port
    finally:
        context.destroy(linger=0)


async def test_restarts_and_undecodable_messages(
    publisher: tuple[zmq.asyncio.Socket, int],
) -> None:
    xpub, port = publisher
    index = PreciseIndex(rebuild_s=600)
    e = Endpoint("127.0.0.1", 9, labels={"epp.dev/kv-events": str(port)})
    subscribers = await follow(Datastore(), index, e)

    async def send(seq: int, *events: Any, raw: bytes | None = None) -> None:
        payload = raw if raw is not None else msgspec.msgpack.encode(Batch(1.0, list(events)))
        await xpub.send_multipart([b"", seq.to_bytes(8, "big"), payload])

    try:
        assert await asyncio.wait_for(xpub.recv(), 10) == b"\x01"  # subscribed to ""
        c = subscribers.counters
        await send(0, stored(1, [1, 2, 3, 4]))
        await send(1, stored(10, [5, 6, 7, 8]))
        await until(lambda: c.messages == 2, "two messages")
        assert index.blocks(e.address) == (2, 0) and e.address in trusted(index)
        await send(0, stored(20, [9, 9, 9, 9]))  # the server restarted: its cache is new
        await until(lambda: c.restarts == 1, "the restart")
        assert index.blocks(e.address) == (1, 0) and e.address in trusted(index)
        await send(1, raw=b"\xc1 not msgpack")
        await until(lambda: c.decode_errors == 1, "the decode error")
        assert e.address not in trusted(index)  # lost: approximate until rebuilt
        await send(2, {"type": "AllBlocksCleared"}, {"type": "Unknown"})
        await until(lambda: c.unknown_events == 1, "the unknown event")
        assert e.address in trusted(index) and c.gaps == 0
        assert c.messages == 4
    finally:
        await subscribers.stop()
    assert index.addresses() == []  # stopping forgets what the endpoint held
