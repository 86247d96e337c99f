"""The breaks a new user met on the main of 825f3f9, caught by the scenario matrix
(docs/testing.md, "The known breaks"): each seed below fails its named invariant on the
EPP of that commit and passes on this tree. Those runs are in the slow tier (``make
test`` checks only what the seeds draw); the old half needs a checkout of that commit,
``git worktree add ../old825 825f3f9``, then ``EPP_SCENARIO_EPP_FROM=../old825 make
test-slow`` (skipped without it)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.scenarios.eppfrom import OtherCheckout
from tests.scenarios.generate import scenario
from tests.scenarios.verdict import judge

# break -> (seed, the shape and fault it draws, the invariant it breaks on 825f3f9)
BREAKS = {
    "lora-preloaded-on-some-servers": (143, "lora-subset", "metrics-fault", "I1"),
    "stack-replica-death-stops-the-stack": (11, "stack-replicas", "epp-replica-kill", "I1"),
    "server-frozen-mid-stream": (123, "plain", "sigstop-mid-stream", "I4"),
}
OLD = os.environ.get("EPP_SCENARIO_EPP_FROM", "")


@pytest.mark.parametrize("name", sorted(BREAKS))
def test_each_seed_still_draws_its_shape_and_fault(name: str) -> None:
    """A generator that draws differently (a shape or fault added) moves the seeds: find
    new ones with ``python -m tests.scenarios.replay --list`` and check them with
    ``--epp-from`` (docs/testing.md)."""
    seed, shape, fault, _ = BREAKS[name]
    drawn = scenario(seed)
    assert (drawn.shape, drawn.fault.kind) == (shape, fault), drawn.describe()


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.skipif(
    not (OLD and (Path(OLD) / "epp" / "__main__.py").is_file()),
    reason="needs EPP_SCENARIO_EPP_FROM=a checkout of 825f3f9 (git worktree add DIR 825f3f9)",
)
@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", sorted(BREAKS))
def test_the_old_epp_breaks_the_named_invariant(name: str, tmp_path: Path) -> None:
    seed, _, _, invariant = BREAKS[name]
    found = judge(seed, tmp_path, OtherCheckout(Path(OLD).resolve()))
    assert any(line.startswith(f"{invariant}: ") for line in found.splitlines()), found


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("name", sorted(BREAKS))
def test_this_tree_passes_the_same_seed(name: str, tmp_path: Path) -> None:
    seed = BREAKS[name][0]
    found = judge(seed, tmp_path)
    assert not found, found
