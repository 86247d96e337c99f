"""The scenario matrix's full tier (``make test-scenarios``): EPP_SCENARIOS generated
seeds from EPP_SCENARIO_BASE on; skipped unless EPP_SCENARIOS is set (docs/testing.md)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.scenarios.verdict import judge

pytestmark = pytest.mark.e2e

COUNT = int(os.environ.get("EPP_SCENARIOS", "0"))
BASE = int(os.environ.get("EPP_SCENARIO_BASE", "1000"))
SEEDS = list(range(BASE, BASE + COUNT))


@pytest.mark.skipif(not COUNT, reason="the full tier: make test-scenarios (EPP_SCENARIOS=N)")
@pytest.mark.timeout(180)
@pytest.mark.parametrize("seed", SEEDS or [0], ids=[f"seed_{s}" for s in SEEDS or [0]])
def test_generated_scenario(seed: int, tmp_path: Path) -> None:
    found = judge(seed, tmp_path)
    assert not found, found
