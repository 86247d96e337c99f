"""Where a held request goes when flow control dispatches it: the endpoint the
scheduler prefers for it, or it waits for that one (pure).

The preference is the scheduler's pick over every endpoint the request may go to, as
without flow control, with the requests held ahead of it counted as in flight where
they wait: the pick weighs the preferred endpoint's queue (running and held requests)
against a miss elsewhere, as the configured scorers do (with the latency scorer, the
latency model's predicted time to first token on each side, queue wait and uncached
prefill included). When that endpoint has room the request goes there. When it has
none, the request waits for it in flow control (:class:`Hold`), not in the engine's
queue, while the latency model predicts its time to first token there (its queue:
running and held requests, plus the prefill of what it does not cache) no later than
on the best endpoint with room (a miss, usually); else it goes to that one. Later
requests that can go elsewhere do not wait behind a held one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from epp.types import Snapshot


@dataclass(frozen=True, slots=True)
class Hold:
    """The request waits in flow control for ``address`` (the scheduler's pick),
    predicted by the latency model to free a slot for it in ``wait_s``."""

    address: str
    wait_s: float


def with_held(snapshot: Snapshot, held_for: Mapping[str, int] | None) -> Snapshot:
    """``snapshot`` with ``held_for`` (address -> requests held for it, ahead) added to
    its in-flight counts: what scheduling sees when those requests were sent."""
    if not held_for:
        return snapshot
    in_flight = dict(snapshot.in_flight)
    for address, n in held_for.items():
        in_flight[address] = in_flight.get(address, 0) + n
    return replace(snapshot, in_flight=in_flight)
