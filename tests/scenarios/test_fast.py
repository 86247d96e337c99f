"""The scenario matrix's fast tier (part of ``make test``): fixed seeds, each with its
shape and fault pinned, that together cover every shape and every fault of the matrix.
A failure names its seed and the command that replays exactly that scenario."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.scenarios.generate import FAULTS_OF, scenario
from tests.scenarios.model import FAULTS, SHAPES
from tests.scenarios.verdict import judge

pytestmark = pytest.mark.e2e

# (seed, shape, fault): every shape and every fault at least once
FAST = (
    (1, "lora-subset", "sigstop-at-once"),
    (5, "pd-nixl", "sigstop-mid-stream"),
    (6, "pd-nixl", "metrics-fault"),
    (7, "workers-2", "sigkill-mid-stream"),
    (11, "stack-replicas", "epp-replica-kill"),
    (28, "plain", "fault-status"),
    (31, "plain", "sigkill-at-once"),
)


def test_the_fast_tier_covers_every_shape_and_fault() -> None:
    assert {shape for _, shape, _ in FAST} == set(SHAPES)
    assert {fault for _, _, fault in FAST} >= set(FAULTS) - {"none"}
    assert all(fault in FAULTS_OF[shape] for _, shape, fault in FAST)


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    ("seed", "shape", "fault"), FAST, ids=[f"seed_{s}-{shape}-{f}" for s, shape, f in FAST]
)
def test_scenario(seed: int, shape: str, fault: str, tmp_path: Path) -> None:
    found = judge(scenario(seed, shape, fault), tmp_path)
    assert not found, found
