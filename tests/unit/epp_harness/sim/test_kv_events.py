"""What the simulated engine announces as KV events: newly cached full blocks with their
token ids and parent, evictions tail first, resets (through a recording sink of the
engine's own KvEventSink seam)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from contextlib import aclosing
from dataclasses import dataclass, field

import orjson

from epp_harness.sim.config import SimConfig
from epp_harness.sim.engine import Engine
from epp_harness.sim.prefix_cache import BlockHash, token_block_hashes
from epp_harness.sim.protocol import ApiKind, GenerationRequest, parse_request
from epp_harness.sim.tokenizer import encode, tokenized

BS = 4


@dataclass
class Recorder:
    events: list[tuple[str, object]] = field(default_factory=list)

    def stored(
        self,
        parent: BlockHash | None,
        hashes: Sequence[BlockHash],
        token_ids: Sequence[int],
        size: int,
    ) -> None:
        self.events.append(("stored", (parent, list(hashes), list(token_ids), size)))

    def removed(self, block: BlockHash) -> None:
        self.events.append(("removed", block))

    def cleared(self) -> None:
        self.events.append(("cleared", None))


def request(prompt: str) -> GenerationRequest:
    body = {"model": "sim-model", "prompt": prompt, "max_tokens": 1}
    req = parse_request(
        ApiKind.COMPLETION, orjson.dumps(body), served_model="sim-model", default_max_tokens=1
    )
    return tokenized(req)


async def run(engine: Engine, prompt: str) -> None:
    async with aclosing(engine.generate(request(prompt))) as tokens:
        async for _ in tokens:
            pass


def engine(kv_blocks: int = 100) -> tuple[Engine, Recorder]:
    recorder = Recorder()
    config = SimConfig(block_size=BS, kv_blocks=kv_blocks, time_scale=0)
    return Engine(config, kv_events=recorder), recorder


def test_new_full_blocks_are_announced_once_with_their_tokens_and_parent() -> None:
    sim, rec = engine()
    asyncio.run(run(sim, "abcdefghij"))  # 10 tokens: 2 full blocks
    hashes = token_block_hashes(encode("abcdefghij"), BS)
    assert rec.events == [("stored", (None, hashes, encode("abcdefgh"), BS))]
    rec.events.clear()
    asyncio.run(run(sim, "abcdefghij"))  # a repeated prompt announces nothing
    assert rec.events == []
    asyncio.run(run(sim, "abcdefghijklmnop"))  # only the continuation, linked to block 2
    longer = token_block_hashes(encode("abcdefghijklmnop"), BS)
    assert rec.events == [("stored", (hashes[1], longer[2:], encode("ijklmnop"), BS))]


def test_the_request_is_tokenized_as_the_simulators_tokenizer_says() -> None:
    req = request("héllo")
    assert req.prompt_token_ids == tuple("héllo".encode()) and req.prompt_tokens == 6


def test_evictions_go_tail_first_and_leave_a_matchable_head() -> None:
    sim, rec = engine(kv_blocks=6)  # 5 usable blocks
    asyncio.run(run(sim, "a" * 4 * BS))  # 4 blocks cached
    first = token_block_hashes(encode("a" * 4 * BS), BS)
    assert sim.cached_blocks(first) == 4
    rec.events.clear()
    # needs 4 blocks: the never-used one, then the a-chain's, which were freed tail first
    asyncio.run(run(sim, "b" * 4 * BS))
    removed = [block for kind, block in rec.events if kind == "removed"]
    assert removed == first[::-1][:3]
    assert sim.cached_blocks(first) == 1


def test_reset_announces_all_blocks_cleared() -> None:
    sim, rec = engine()
    asyncio.run(run(sim, "x" * 3 * BS))
    sim.reset_prefix_cache()
    assert rec.events[-1] == ("cleared", None)
    assert sim.kv.pool.num_cached == 0
