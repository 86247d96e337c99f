"""Warm misses for bench.routing (pure): requests that paid a full prefill of a prefix
that had been computed before in the same run.

A request is *warm* when an earlier request marking one of its ``warm_prefixes`` keys
(bench.workload) had got its first token (so its prompt was prefilled and cached
somewhere) before this request arrived; cold first visits are not counted. A warm
request is a *warm miss* when the server's ``cached_tokens`` fall short of that prefix's
full KV blocks (the longest warm prefix counts): the router sent it where the prefix was
not (or no longer) cached. Warm-up traffic marks keys too, as the caches it leaves
behind are what the measured requests find.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from bench.workload import CHARS_PER_TOKEN


def full_block_tokens(chars: int, block_size: int, chars_per_token: float = CHARS_PER_TOKEN) -> int:
    """Tokens in the full KV blocks of a ``chars``-character prefix (what can be cached)."""
    return int(chars // (block_size * chars_per_token)) * block_size


@dataclass(frozen=True, slots=True)
class Visit:
    """One sent request: when it was due, when its first token came (None: never), what
    it could have found warm (key, prefix characters; longest first), what it marks, and
    the cached tokens its server reported (None: no usage, e.g. it failed)."""

    due: float
    first_token: float | None
    warm_prefixes: tuple[tuple[str, int], ...]
    marks: tuple[str, ...]
    cached_tokens: int | None


@dataclass(frozen=True, slots=True)
class WarmCount:
    requests: int  # with a usage report
    warm: int  # of which an earlier request had computed their prefix
    misses: int  # of which the prefix's full blocks were not served from cache

    @property
    def miss_rate(self) -> float:
        return self.misses / self.warm if self.warm else math.nan


class WarmTracker:
    """Which prefix keys have been computed so far in one policy's run, and when."""

    def __init__(self, block_size: int, chars_per_token: float = CHARS_PER_TOKEN) -> None:
        """``block_size`` in the servers' tokens, ``chars_per_token`` their tokenizer's
        (4 for the simulator's default rule, 1 for its byte tokenizer, a measured mean
        for a real model's)."""
        self.block_size = block_size
        self.chars_per_token = chars_per_token
        self._computed: dict[str, float] = {}  # key -> earliest first token

    def account(self, visits: Sequence[Visit]) -> WarmCount:
        """Record ``visits`` (one cell, any order) and count their warm misses."""
        for v in visits:
            if v.first_token is not None:
                for key in v.marks:
                    self._computed[key] = min(self._computed.get(key, math.inf), v.first_token)
        requests = warm = misses = 0
        for v in visits:
            if v.cached_tokens is None:
                continue
            requests += 1
            chars = next(
                (c for key, c in v.warm_prefixes if self._computed.get(key, math.inf) < v.due),
                None,
            )
            if chars is None:
                continue
            warm += 1
            if v.cached_tokens < full_block_tokens(chars, self.block_size, self.chars_per_token):
                misses += 1
        return WarmCount(requests, warm, misses)
