"""KV blocks a NIXL prefill keeps for a remote decode to pull.

A prefill leg's prompt blocks stay allocated (they count in the engine's KV usage, as
in vLLM) under fresh block ids until a decode pulls them or the hold time runs out,
whichever comes first; then they are freed. A second pull of the same ids finds them
gone, as does a pull after the hold time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

from epp_harness.sim.engine import Engine, blocks_for
from epp_harness.sim.kv_cache import SeqBlocks


@dataclass(slots=True, eq=False)
class _Holding:
    block_ids: tuple[int, ...]
    tokens: int
    blocks: SeqBlocks
    timer: asyncio.TimerHandle | None = field(default=None)


class KvHolds:
    """Held prefills by block id, each freed on pull or after ``hold_seconds``."""

    def __init__(self, engine: Engine, hold_seconds: float) -> None:
        self._engine = engine
        self._hold_seconds = hold_seconds
        self._by_block: dict[int, _Holding] = {}
        self._next_id = 0

    @property
    def blocks_held(self) -> int:
        return len(self._by_block)

    def hold(self, prompt_tokens: int) -> list[int]:
        """Keep the KV of a ``prompt_tokens`` prompt; returns its block ids."""
        count = max(1, blocks_for(prompt_tokens, self._engine.config.block_size))
        ids = tuple(range(self._next_id, self._next_id + count))
        self._next_id += count
        holding = _Holding(ids, prompt_tokens, self._engine.hold_blocks(count))
        for block in ids:
            self._by_block[block] = holding
        holding.timer = asyncio.get_running_loop().call_later(
            self._hold_seconds, self._free, holding
        )
        return list(ids)

    def take(self, block_ids: Sequence[int]) -> int | None:
        """Hand the KV of the prefill holding ``block_ids`` to a puller and free it: the
        number of prompt tokens it covers, or None when any block is not held (pulled
        already, expired, or never handed out) or the ids span several prefills."""
        found = [self._by_block.get(b) for b in block_ids]
        holding = found[0] if found else None
        if holding is None or any(h is not holding for h in found):
            return None
        self._free(holding)
        return holding.tokens

    def close(self) -> None:
        """Free everything (shutdown): no timer outlives the event loop."""
        for holding in list({id(h): h for h in self._by_block.values()}.values()):
            self._free(holding)

    def _free(self, holding: _Holding) -> None:
        if self._by_block.get(holding.block_ids[0]) is not holding:
            return  # freed already
        for block in holding.block_ids:
            del self._by_block[block]
        self._engine.release_blocks(holding.blocks)
        if holding.timer is not None:
            holding.timer.cancel()
