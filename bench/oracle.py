"""The oracle reference policies of bench.routing, which know every request's group
(pure: plain data in, server indexes out).

``ideal``: each server gets a fixed share of the groups, at most as many as its KV cache
can keep (``per_server``). Groups are taken by popularity (Zipf weight, heaviest first)
and each goes to the server with the least weight so far that still has room
(longest-processing-time-first), so the servers' loads come out as even as whole groups
allow. A group heavier than 1 / servers of the traffic still has one home, so its server
saturates first: with Zipf s = 1.1 over 16 groups on 4 servers the top group is ~33 % of
the traffic, 1.3x a server's fair share.

``ideal-split``: the same, but a group heavier than a fair share is first cut into
ceil(weight x servers) equal pieces, each on a different server (a copy of its prefix
per piece, counted against ``per_server``); its requests take turns over its homes
(multi-turn: a session keeps one home). Balance at the price of a second prefix copy.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence

Assignment = list[tuple[int, ...]]  # group index -> its servers (its homes)
ORACLES = ("ideal", "ideal-split")


def groups_per_server(free_blocks: int, prefix_blocks: int) -> int:
    """How many groups' prefixes one server's free KV keeps (at least 1)."""
    return max(1, free_blocks // max(prefix_blocks, 1))


def assign_groups(
    weights: Sequence[float],
    servers: int,
    per_server: int,
    split: bool = False,
    counts: Sequence[int] | None = None,
) -> Assignment:
    """Group index -> its servers, longest-processing-time-first on ``weights``.

    Ties go to the lower server index. With ``split``, a group heavier than 1 / servers
    is cut into ceil(weight x servers) pieces on distinct servers. A piece goes to the
    least loaded server that has room (fewer than ``per_server`` groups) and does not
    hold the group yet; when none has room (the groups do not fit the pool's KV at all),
    to the least loaded server that does not hold it. ``counts`` (per group) sets the
    number of pieces instead.
    """
    if servers < 1 or per_server < 1:
        raise ValueError("servers and per_server must be >= 1")
    pieces: list[tuple[float, int]] = []  # (weight, group)
    for group, weight in enumerate(weights):
        count = min(servers, max(1, math.ceil(weight * servers - 1e-9))) if split else 1
        if counts is not None:
            count = min(servers, max(1, counts[group]))
        pieces += [(weight / count, group)] * count
    load = [0.0] * servers
    held: list[set[int]] = [set() for _ in range(servers)]
    homes: list[list[int]] = [[] for _ in weights]
    for weight, group in sorted(pieces, key=lambda p: (-p[0], p[1])):
        free = [s for s in range(servers) if group not in held[s]]
        room = [s for s in free if len(held[s]) < per_server] or free
        best = min(room, key=lambda s: (load[s], s))
        homes[group].append(best)
        held[best].add(group)
        load[best] += weight
    return [tuple(h) for h in homes]


def kv_homes(share: float, servers: int, copies: float) -> int:
    """Homes for a group with ``share`` of the traffic when the pool's KV holds
    ``copies`` prefix copies: every group one, the copies shared out by popularity
    (``round(share x copies)``), at most one per server (bench.routing_model's
    ``ideal-kv-jsq``)."""
    return min(servers, max(1, round(share * copies)))


def server_loads(weights: Sequence[float], assignment: Assignment, servers: int) -> list[float]:
    """Each server's share of the traffic under ``assignment`` (a group's traffic split
    evenly over its homes)."""
    load = [0.0] * servers
    for group, homes in enumerate(assignment):
        for server in homes:
            load[server] += weights[group] / len(homes)
    return load


def destination(
    index: int, group: int, assignment: Assignment | None, servers: int, session: str = ""
) -> int:
    """The server an oracle sends request ``index`` of ``group`` to: one of the group's
    homes, taking turns by request, or by ``session`` (a session keeps its home).
    Without an assignment (the control workload, where groups mean nothing) round robin
    by request."""
    if assignment is None:
        return index % servers
    homes = assignment[group]
    turn = zlib.crc32(session.encode()) if session else index
    return homes[turn % len(homes)]


def max_over_mean(loads: Sequence[float]) -> float:
    mean = sum(loads) / len(loads)
    return max(loads) / mean if mean else math.nan
