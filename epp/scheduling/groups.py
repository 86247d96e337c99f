"""How many endpoints ("homes") a group of requests sharing a prompt prefix should be
cached on, from its share of the recent traffic (pure: counts, no clock).

A *group* is keyed by its prompt's first block. Its share is the fraction of the last
``window`` routed requests that belonged to it. A home should carry at most
``home_share`` of one endpoint's fair share of the pool's traffic, so a group needs
``ceil(share x endpoints / home_share)`` homes (at least one): with Zipf-skewed groups on
4 endpoints and ``home_share`` 0.8, a group with a third of the traffic gets two homes
and every other group one. The predicted-latency scorer charges a copy beyond that (a
request sent to an endpoint that does not hold the group while enough others do) an
extra miss, because the copy evicts other groups' prefixes from a KV cache that cannot
hold every group everywhere.
"""

from __future__ import annotations

import math
from collections import Counter, deque

WINDOW = 1000  # routed requests the shares are counted over


class GroupShares:
    """Each group's share of the last ``window`` routed requests."""

    def __init__(self, window: int = WINDOW) -> None:
        self._recent: deque[int] = deque(maxlen=max(window, 1))
        self._counts: Counter[int] = Counter()

    def routed(self, key: int) -> None:
        recent = self._recent
        if len(recent) == recent.maxlen:
            old = recent[0]
            self._counts[old] -= 1
            if not self._counts[old]:
                del self._counts[old]
        recent.append(key)
        self._counts[key] += 1

    def share(self, key: int) -> float:
        return self._counts.get(key, 0) / len(self._recent) if self._recent else 0.0


def homes_needed(share: float, endpoints: int, home_share: float) -> int:
    """Homes for a group with ``share`` of the traffic on ``endpoints`` endpoints."""
    if home_share <= 0 or endpoints <= 0:
        return endpoints
    return max(1, math.ceil(share * endpoints / home_share - 1e-9))
