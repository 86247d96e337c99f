"""The scenario matrix's fast tier (part of ``make test``): fixed seeds whose scenarios
cover every shape and every fault of the matrix. A failure names its seed and the
command that replays exactly that scenario."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.scenarios.verdict import judge

pytestmark = pytest.mark.e2e

# seeds whose scenarios cover every shape and every fault (python -m
# tests.scenarios.replay --list shows what a seed draws)
FAST = {
    1: "lora-subset, sigstop-at-once",
    5: "pd-nixl, sigstop-mid-stream",
    6: "pd-nixl, metrics-fault",
    7: "workers-2, sigkill-mid-stream",
    11: "stack-replicas, epp-replica-kill",
    28: "plain, fault-status",
    31: "plain, sigkill-at-once",
}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("seed", sorted(FAST), ids=[f"seed_{s}" for s in sorted(FAST)])
def test_scenario(seed: int, tmp_path: Path) -> None:
    found = judge(seed, tmp_path)
    assert not found, found
