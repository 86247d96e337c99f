"""The ``ideal`` reference policy of bench.routing: an oracle that knows every request's
group (pure: plain data in, server indexes out).

Each server gets a fixed share of the groups, at most as many as its KV cache can keep
(``per_server``). Groups are taken by popularity (Zipf weight, heaviest first) and each
goes to the server with the least weight so far that still has room
(longest-processing-time-first), so the servers' loads come out as even as whole groups
allow. A group heavier than 1 / servers of the traffic still has one home: its server
saturates first (with Zipf s = 1.1 over 16 groups the top group is ~33 % of the traffic,
1.3x a server's fair share), which this reference accepts rather than splitting a group
and paying its prefix twice.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def groups_per_server(free_blocks: int, prefix_blocks: int) -> int:
    """How many groups' prefixes one server's free KV keeps (at least 1)."""
    return max(1, free_blocks // max(prefix_blocks, 1))


def assign_groups(weights: Sequence[float], servers: int, per_server: int) -> list[int]:
    """Group index -> server index, longest-processing-time-first on ``weights``.

    Ties go to the lower server index. When every server already holds ``per_server``
    groups (the groups do not fit the pool's KV at all), the rest go to the least loaded
    server regardless.
    """
    if servers < 1 or per_server < 1:
        raise ValueError("servers and per_server must be >= 1")
    load = [0.0] * servers
    count = [0] * servers
    out = [0] * len(weights)
    for group in sorted(range(len(weights)), key=lambda g: (-weights[g], g)):
        room = [s for s in range(servers) if count[s] < per_server] or list(range(servers))
        best = min(room, key=lambda s: (load[s], s))
        out[group] = best
        load[best] += weights[group]
        count[best] += 1
    return out


def server_loads(weights: Sequence[float], assignment: Sequence[int], servers: int) -> list[float]:
    """Each server's share of the traffic under ``assignment``."""
    load = [0.0] * servers
    for group, server in enumerate(assignment):
        load[server] += weights[group]
    return load


def destination(index: int, group: int, assignment: Sequence[int] | None, servers: int) -> int:
    """The server the oracle sends request ``index`` of ``group`` to; without an
    assignment (the control workload, where groups mean nothing) round robin by request."""
    if assignment is None:
        return index % servers
    return assignment[group]


def max_over_mean(loads: Sequence[float]) -> float:
    mean = sum(loads) / len(loads)
    return max(loads) / mean if mean else math.nan
