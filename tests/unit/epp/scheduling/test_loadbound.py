"""A group's share of the recent traffic (the prefix scorers' group-aware load bound)."""

from __future__ import annotations

import pytest

from epp.scheduling.loadbound import GroupShares


def test_shares_follow_the_recent_mix() -> None:
    shares = GroupShares(window=100)
    for i in range(1000):  # groups 1 and 2 at 3:1
        shares.routed(1 if i % 4 else 2)
    assert shares.share(1) == pytest.approx(0.75, abs=0.02)
    assert shares.share(2) == pytest.approx(0.25, abs=0.02)
    assert shares.share(3) == 0.0  # never routed
    for _ in range(1000):  # the mix changes: group 3 alone
        shares.routed(3)
    assert shares.share(3) == pytest.approx(1.0, abs=0.01)
    assert shares.share(1) < 0.01


def test_a_new_group_counts_from_its_first_request() -> None:
    shares = GroupShares(window=100)
    assert shares.share(1) == 0.0  # nothing routed yet
    shares.routed(1)
    assert shares.share(1) == pytest.approx(1.0)


def test_groups_that_fell_silent_are_forgotten() -> None:
    shares = GroupShares(window=10)
    for key in range(1000):  # each group once: the old ones decay away
        shares.routed(key)
    assert len(shares._counts) <= 8 * 10 + 1
    assert shares.share(999) > 0.0
