"""Where a held request goes when the endpoint the scheduler prefers for it (its home:
usually where its prefix is cached) has no room but others have: wait for the home, or
spill to the best endpoint with room now (pure; flow control asks at each dispatch).

Both sides are the latency model's predictions of the time to first token: on the
home, its queue wait (behind the requests it runs and those already held for it) plus
the prefill of what it does not cache; elsewhere, the prefill of what that endpoint
does not cache (a miss, usually). The request waits for its home while the home is
predicted to serve it no later than the miss would, and while it has not already
waited for its home as long as the miss takes (a bound on a wrong prediction: it never
waits more than a miss's time for its home; the time it waited for its turn before
does not count).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Hold:
    """The request waits in flow control for ``address`` (its home), predicted to free
    a slot for it in ``wait_s``."""

    address: str
    wait_s: float


def waits_for_home(home_ttft_s: float, spill_ttft_s: float, held_s: float) -> bool:
    """Whether a request that already waited ``held_s`` for its home keeps waiting for
    it (predicted TTFT there ``home_ttft_s``, queue wait included) rather than going
    where there is room now (predicted TTFT ``spill_ttft_s``)."""
    return home_ttft_s <= spill_ttft_s and held_s < spill_ttft_s
