"""The breaks a new user met on the main of 825f3f9, caught by the scenario matrix
(docs/testing.md, "The known breaks"): each seed below fails its named invariant on the
EPP of that commit and passes on this tree. Slow tier, and the old half needs a checkout
of that commit: ``git worktree add ../old825 825f3f9``, then
``EPP_SCENARIO_EPP_FROM=../old825 make test-slow`` (skipped without it)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.scenarios.eppfrom import OtherCheckout
from tests.scenarios.verdict import judge

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

# break -> (seed, the invariant it breaks on 825f3f9)
BREAKS = {
    "lora-preloaded-on-some-servers": (143, "I1"),
    "stack-replica-death-stops-the-stack": (11, "I1"),
    "server-frozen-mid-stream": (123, "I4"),
}
OLD = os.environ.get("EPP_SCENARIO_EPP_FROM", "")


@pytest.mark.skipif(
    not (OLD and (Path(OLD) / "epp" / "__main__.py").is_file()),
    reason="needs EPP_SCENARIO_EPP_FROM=a checkout of 825f3f9 (git worktree add DIR 825f3f9)",
)
@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", sorted(BREAKS))
def test_the_old_epp_breaks_the_named_invariant(name: str, tmp_path: Path) -> None:
    seed, invariant = BREAKS[name]
    found = judge(seed, tmp_path, OtherCheckout(Path(OLD).resolve()))
    assert any(line.startswith(f"{invariant}: ") for line in found.splitlines()), found


@pytest.mark.timeout(180)
@pytest.mark.parametrize("name", sorted(BREAKS))
def test_this_tree_passes_the_same_seed(name: str, tmp_path: Path) -> None:
    seed, _ = BREAKS[name]
    found = judge(seed, tmp_path)
    assert not found, found
