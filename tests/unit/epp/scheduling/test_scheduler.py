"""The scheduler's decode pick for deferred decode selection: the decode profile alone,
over the pool outside the endpoint that prefilled, on plain snapshots."""

from __future__ import annotations

import random

import pytest

from epp.config import build_scheduler
from epp.errors import NoEndpointError
from epp.types import Endpoint, EndpointState, InferenceRequest, Role, Snapshot

PREFILL = Endpoint("10.0.0.1", 8000, Role.PREFILL)
BOTH = Endpoint("10.0.0.2", 8000, Role.BOTH)
DECODE = Endpoint("10.0.0.3", 8000, Role.DECODE)
REQUEST = InferenceRequest("r", "m", "/v1/completions", "a long prompt " * 200, max_tokens=5)
SINGLE = """
plugins:
  - {type: decode-filter}
  - {type: max-score-picker}
schedulingProfiles:
  - {name: only, plugins: [{pluginRef: decode-filter}, {pluginRef: max-score-picker}]}
"""


def snapshot(*endpoints: Endpoint) -> Snapshot:
    return Snapshot(tuple(EndpointState(e) for e in endpoints), {})


@pytest.mark.parametrize("config", ["", SINGLE], ids=["pd-handler", "single-profile"])
def test_pick_decode_runs_the_decode_profile_outside_the_excluded(config: str) -> None:
    scheduler = build_scheduler(config)
    snap = snapshot(PREFILL, BOTH, DECODE)
    for seed in range(10):
        rng = random.Random(seed)
        result = scheduler.pick_decode(REQUEST, snap, rng, frozenset({BOTH.address}))
        assert result.targets == (DECODE,)  # never the prefill-only one, nor the excluded
        assert (result.prefill, result.decision) == (None, "")
    picked = {
        scheduler.pick_decode(REQUEST, snap, random.Random(seed)).primary for seed in range(20)
    }
    assert picked == {BOTH, DECODE}


def test_pick_decode_with_nothing_left_to_decode_raises() -> None:
    scheduler = build_scheduler("")
    with pytest.raises(NoEndpointError, match="decode-filter"):
        scheduler.pick_decode(
            REQUEST, snapshot(PREFILL, DECODE), random.Random(0), frozenset({DECODE.address})
        )
