"""How many endpoints ("homes") should cache a shared prompt prefix, from how much work
its requests bring (pure: callers pass the time).

A *group* is the requests whose prompts start with the same block (one system prompt,
one chat template with the same context). Its demand is the slots its requests keep
busy: arrival rate x mean slot time. One home should carry at most ``share`` of an
endpoint's slots of it, so a group gets ``ceil(demand / (share x slots))`` homes (at
least one): a rare group keeps one home, and its prefix is not spread over every
endpoint's cache; a hot group gets a second home before its first one queues.

When the index sees more holders than the group needs, all but the first ``homes`` (by
prefix held, then a hash of the group and the address, so every request of a group
agrees) are treated as not caching it: traffic concentrates on the chosen homes and
the extra copies age out of the caches, leaving room for other groups. When it sees
fewer, the scorer lets the least loaded other endpoint take the group without charging
it a miss: the new home is made now, while the first one still has room.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass

import xxhash

# how fast the rate estimate forgets (seconds): long enough to count a rare group's
# requests, short enough to follow a change of workload
RATE_WINDOW_S = 20.0
MAX_GROUPS = 100_000  # groups remembered (least recently seen forgotten first)


class GroupDemand:
    """Arrival rate per group, an exponentially decaying count over ``RATE_WINDOW_S``."""

    def __init__(self, window_s: float = RATE_WINDOW_S, max_groups: int = MAX_GROUPS) -> None:
        self.window_s = window_s
        self.max_groups = max_groups
        self._groups: OrderedDict[int, tuple[float, float]] = OrderedDict()  # rate, when

    def rate(self, key: int, now: float) -> float:
        """Requests per second of the group, as of ``now``."""
        found = self._groups.get(key)
        if found is None:
            return 0.0
        rate, when = found
        return rate * math.exp(-max(now - when, 0.0) / self.window_s)

    def arrived(self, key: int, now: float) -> None:
        self._groups[key] = (self.rate(key, now) + 1.0 / self.window_s, now)
        self._groups.move_to_end(key)
        if len(self._groups) > self.max_groups:
            self._groups.popitem(last=False)

    def __len__(self) -> int:
        return len(self._groups)


def homes_needed(rate: float, slot_s: float, slots: float, share: float) -> int:
    """Endpoints a group with ``rate`` requests/s should be cached on."""
    if share <= 0 or slots <= 0:
        return 1
    return max(1, math.ceil(rate * slot_s / (share * slots) - 1e-9))


@dataclass(frozen=True, slots=True)
class HomePlan:
    """``ignored``: holders whose copy of the prefix this request should not count on;
    ``replicate``: the group needs another home, so a miss elsewhere is not charged."""

    ignored: frozenset[str]
    replicate: bool


NO_PLAN = HomePlan(frozenset(), False)


def plan_homes(key: int, matches: Mapping[str, int], homes: int) -> HomePlan:
    """Which holders (``matches``: address -> leading blocks held) serve the group."""
    if len(matches) == homes:
        return NO_PLAN
    if len(matches) < homes:
        return HomePlan(frozenset(), True)
    ranked = sorted(matches, key=lambda a: (-matches[a], _rank(key, a)))
    return HomePlan(frozenset(ranked[homes:]), False)


def _rank(key: int, address: str) -> int:
    """Rendezvous hash: a stable, per-group order of endpoints."""
    return int(xxhash.xxh64_intdigest(address.encode(), key & 0xFFFFFFFFFFFFFFFF))
