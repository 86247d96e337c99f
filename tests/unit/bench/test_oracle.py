"""bench/oracle.py: the oracle policies' group-to-server assignment, on plain data."""

from __future__ import annotations

from collections import Counter

import pytest

from bench.oracle import (
    assign_groups,
    destination,
    groups_per_server,
    kv_homes,
    max_over_mean,
    server_loads,
)
from bench.workload import group_weights

ZIPF = group_weights(16, 1.1)


def test_lpt_balances_the_issue_zipf_setting() -> None:
    assignment = assign_groups(ZIPF, servers=4, per_server=6)
    assert all(len(homes) == 1 for homes in assignment)
    counts = Counter(homes[0] for homes in assignment)
    assert set(counts) == {0, 1, 2, 3} and max(counts.values()) <= 6
    loads = server_loads(ZIPF, assignment, 4)
    assert sum(loads) == pytest.approx(1.0)
    # the top group alone (~33 %) is above a fair share: its server is the busiest and
    # gets nothing else while the others catch up
    assert assignment[0] == (0,) and loads[0] == max(loads)
    assert max_over_mean(loads) == pytest.approx(4 * ZIPF[0], rel=0.05)
    rest = sorted(loads[1:])
    assert rest[-1] - rest[0] < 0.03


def test_split_gives_a_heavy_group_two_homes_and_balances() -> None:
    assignment = assign_groups(ZIPF, servers=4, per_server=6, split=True)
    assert len(assignment[0]) == 2 and len(set(assignment[0])) == 2  # 33 % -> 2 pieces
    assert all(len(homes) == 1 for homes in assignment[1:])  # the rest fit a fair share
    assert sum(len(h) for h in assignment) == 17
    per_server = Counter(s for homes in assignment for s in homes)
    assert max(per_server.values()) <= 6
    loads = server_loads(ZIPF, assignment, 4)
    assert sum(loads) == pytest.approx(1.0)
    assert max_over_mean(loads) < 1.1  # vs ~1.3 with whole groups
    assert max_over_mean(loads) < max_over_mean(server_loads(ZIPF, assign_groups(ZIPF, 4, 6), 4))


def test_lpt_by_hand() -> None:
    # 0.4 -> s0; 0.3 -> s1; 0.2 -> s1 (0.3 < 0.4); 0.1 -> s0 (0.4 < 0.5)
    assert assign_groups([0.4, 0.3, 0.2, 0.1], servers=2, per_server=2) == [(0,), (1,), (1,), (0,)]
    # uniform weights: round-robin-like, ties to the lower index
    assert assign_groups([0.25] * 4, servers=2, per_server=4) == [(0,), (1,), (0,), (1,)]
    # split: 0.7 of 2 servers -> 2 pieces of 0.35, one per server
    assert assign_groups([0.7, 0.3], servers=2, per_server=2, split=True) == [(0, 1), (0,)]


def test_kv_share_caps_groups_per_server() -> None:
    # capacity 1: one group per server, in weight order, whatever the loads
    assert assign_groups([0.7, 0.1, 0.1, 0.1], servers=4, per_server=1) == [(0,), (1,), (2,), (3,)]
    # without the cap s1 would take all three light groups; with it each server holds 2
    assignment = assign_groups([0.5, 0.2, 0.2, 0.1], servers=2, per_server=2)
    assert Counter(h[0] for h in assignment) == Counter({0: 2, 1: 2})
    # more groups than the pool can hold: the rest go to the least loaded anyway
    over = assign_groups([0.3, 0.3, 0.2, 0.2], servers=2, per_server=1)
    assert over[:2] == [(0,), (1,)] and sorted(h[0] for h in over[2:]) == [0, 1]
    with pytest.raises(ValueError):
        assign_groups([1.0], servers=0, per_server=1)


def test_groups_per_server_from_free_blocks() -> None:
    assert groups_per_server(free_blocks=600, prefix_blocks=94) == 6
    assert groups_per_server(free_blocks=50, prefix_blocks=94) == 1  # at least one


def test_destination_takes_turns_keeps_sessions_and_round_robins_without_groups() -> None:
    assignment = [(2, 0), (1,)]
    assert [destination(i, g, assignment, 3) for i, g in enumerate([0, 0, 1, 0])] == [2, 0, 1, 0]
    # a session keeps one home, whichever request of it this is
    assert len({destination(i, 0, assignment, 3, session="7-3") for i in range(10)}) == 1
    sessions = {destination(0, 0, assignment, 3, session=f"1-{n}") for n in range(50)}
    assert sessions == {0, 2}  # and sessions spread over the homes
    assert [destination(i, 99, None, 3) for i in range(5)] == [0, 1, 2, 0, 1]


def test_counts_set_each_groups_homes() -> None:
    homes = assign_groups([0.5, 0.3, 0.2], servers=3, per_server=2, counts=[3, 2, 1])
    assert [len(h) for h in homes] == [3, 2, 1]
    assert all(len(set(h)) == len(h) for h in homes)


def test_kv_homes_share_the_pools_copies_by_popularity() -> None:
    assert kv_homes(0.33, 4, 24) == 4  # at most one per server
    assert kv_homes(0.08, 4, 24) == 2
    assert kv_homes(0.01, 4, 24) == 1  # every group one
