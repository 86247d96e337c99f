"""The reflector's retry delays: exponential, capped, jittered, reset on success."""

from __future__ import annotations

from epp.discovery.reflector import Backoff


def test_delays_double_up_to_the_cap_and_reset() -> None:
    backoff = Backoff(0.5, 4.0, rng=lambda: 1.0)
    assert [backoff.delay() for _ in range(6)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    backoff.reset()
    assert backoff.delay() == 0.5


def test_jitter_keeps_at_least_half_the_step() -> None:
    low = Backoff(2.0, 8.0, rng=lambda: 0.0)
    assert [low.delay() for _ in range(3)] == [1.0, 2.0, 4.0]
