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

# break -> (seeds, the shape and fault each draws, the invariant the old EPP breaks).
# The old EPP's LoRA miss depends on timing (an adapter request that comes while no
# fresh scrape shows the adapter running anywhere): one of three seeds must catch it
BREAKS = {
    "lora-preloaded-on-some-servers": (
        ((143, "lora-subset", "metrics-fault"), (87, "lora-subset", "fault-status"),
         (15, "lora-subset", "none")),
        "I1",
    ),
    "stack-replica-death-stops-the-stack": (((11, "stack-replicas", "epp-replica-kill"),), "I1"),
    "server-frozen-mid-stream": (((123, "plain", "sigstop-mid-stream"),), "I4"),
}  # fmt: skip
OLD = os.environ.get("EPP_SCENARIO_EPP_FROM", "")


@pytest.mark.parametrize("name", sorted(BREAKS))
def test_each_seed_still_draws_its_shape_and_fault(name: str) -> None:
    """A generator that draws differently (a shape or fault added) moves the seeds: find
    new ones with ``python -m tests.scenarios.replay --list`` and check them with
    ``--epp-from`` (docs/testing.md)."""
    for seed, shape, fault in BREAKS[name][0]:
        drawn = scenario(seed)
        assert (drawn.shape, drawn.fault.kind) == (shape, fault), drawn.describe()


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.skipif(
    not (OLD and (Path(OLD) / "epp" / "__main__.py").is_file()),
    reason="needs EPP_SCENARIO_EPP_FROM=a checkout of 825f3f9 (git worktree add DIR 825f3f9)",
)
@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", sorted(BREAKS))
def test_the_old_epp_breaks_the_named_invariant(name: str, tmp_path: Path) -> None:
    seeds, invariant = BREAKS[name]
    reports = []
    for seed, _, _ in seeds:
        (tmp := tmp_path / str(seed)).mkdir()
        found = judge(seed, tmp, OtherCheckout(Path(OLD).resolve()))
        if any(line.startswith(f"{invariant}: ") for line in found.splitlines()):
            return
        reports.append(found or f"seed {seed}: every invariant held")
    pytest.fail(f"no seed broke {invariant} on the old EPP:\n" + "\n".join(reports))


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(540)
@pytest.mark.parametrize("name", sorted(BREAKS))
def test_this_tree_passes_the_same_seeds(name: str, tmp_path: Path) -> None:
    for seed, _, _ in BREAKS[name][0]:
        (tmp := tmp_path / str(seed)).mkdir()
        found = judge(seed, tmp)
        assert not found, found
