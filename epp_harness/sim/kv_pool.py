"""A KV pool shared by simulator processes (Mooncake store / LMCache style): a directory.

Each cached block is one empty file named by its chained block hash, so a file stands
for the whole prefix up to its block (see ``epp_harness.sim.prefix_cache``). The file has no
content, so creating it is atomic: a reader in another process sees a block or not,
never half of one. Blocks of different models or block sizes live
in different subdirectories and never match. The pool never evicts: point each
deployment (or test) at its own directory.

File I/O runs in a worker thread: a long prompt is hundreds of files, and the event
loop keeps serving meanwhile.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence
from pathlib import Path

from epp_harness.sim.prefix_cache import BlockHash


class KvPool:
    """The pool at ``root`` for one model and block size."""

    def __init__(self, root: str, model: str, block_size: int) -> None:
        space = hashlib.blake2b(model.encode(), digest_size=8).hexdigest()
        self.directory = Path(root) / f"{space}-b{block_size}"

    async def match(self, hashes: Sequence[BlockHash]) -> int:
        """Number of leading blocks of ``hashes`` present in the pool."""
        return await asyncio.to_thread(self._match, list(hashes))

    async def add(self, hashes: Sequence[BlockHash]) -> int:
        """Store blocks (already present ones are skipped); returns how many were new."""
        return await asyncio.to_thread(self._add, list(hashes))

    def _match(self, hashes: list[BlockHash]) -> int:
        matched = 0
        for h in hashes:
            if not (self.directory / h.hex()).exists():
                break
            matched += 1
        return matched

    def _add(self, hashes: list[BlockHash]) -> int:
        self.directory.mkdir(parents=True, exist_ok=True)
        added = 0
        for h in hashes:
            path = self.directory / h.hex()
            try:
                path.touch(exist_ok=False)
            except FileExistsError:
                continue
            added += 1
        return added
