"""bench/warmth.py: warm-miss accounting, on plain data."""

from __future__ import annotations

import math

from bench.warmth import Visit, WarmTracker, full_block_tokens

G = (("group 0", 6000),)  # a 1,500-token system prompt: 93 full 16-token blocks
FULL = 93 * 16


def visit(
    due: float,
    first: float | None,
    cached: int | None,
    prefixes: tuple[tuple[str, int], ...] = G,
    marks: tuple[str, ...] = ("group 0",),
) -> Visit:
    return Visit(due, first, prefixes, marks, cached)


def test_full_block_tokens() -> None:
    assert full_block_tokens(6000, 16) == FULL
    assert full_block_tokens(63, 16) == 0 and full_block_tokens(64, 16) == 16


def test_cold_first_visit_is_no_miss_later_ones_are_judged() -> None:
    t = WarmTracker(block_size=16)
    count = t.account(
        [
            visit(0.0, 0.2, 0),  # cold: nothing computed before
            visit(0.1, 0.4, 0),  # arrived before the first one's prefill ended: still cold
            visit(0.5, 0.6, FULL),  # warm, hit
            visit(0.7, 0.9, 16),  # warm, partial: a miss
            visit(0.8, None, None),  # failed: no usage, not counted
        ]
    )
    assert (count.requests, count.warm, count.misses) == (4, 2, 1)
    assert count.miss_rate == 0.5


def test_state_carries_over_from_warmup_to_later_cells() -> None:
    t = WarmTracker(block_size=16)
    assert t.account([visit(0.0, 0.1, 0)]).warm == 0  # the warm-up
    later = t.account([visit(5.0, 5.2, 0)])
    assert (later.warm, later.misses) == (1, 1)
    assert math.isnan(t.account([]).miss_rate)


def test_longest_warm_prefix_counts() -> None:
    t = WarmTracker(block_size=16)
    session = (("session s turn 1", 8000), ("group 0", 6000))
    t.account([visit(0.0, 0.1, 0, marks=("group 0", "session s turn 1"))])
    # turn 2 found only the system prompt cached: a miss of the session's history
    assert t.account([visit(1.0, 1.1, FULL, prefixes=session)]).misses == 1
    # another session's first turn: only the group is warm, and the system prompt hit
    other = (("session x turn 0", 8000), ("group 0", 6000))
    assert t.account([visit(2.0, 2.1, FULL, prefixes=other)]).misses == 0
    # the control workload: no prefixes, never warm
    assert t.account([visit(3.0, 3.1, 0, prefixes=(), marks=())]).warm == 0
