"""The breaks a new user met on the main of 825f3f9, caught by the scenario matrix
(docs/testing.md, "The known breaks"): each seed below fails its named invariant on the
EPP of that commit and passes on this tree. Those runs are in the slow tier (``make
test`` checks only that the seeds still draw the same scenarios); the old half needs a
checkout of that commit, ``git worktree add ../old825 825f3f9``, then
``EPP_SCENARIO_EPP_FROM=../old825 make test-slow`` (skipped without it)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.scenarios.eppfrom import OtherCheckout
from tests.scenarios.generate import requests, scenario
from tests.scenarios.verdict import judge

# break -> (scenarios: seed, shape, fault; the invariant the old EPP breaks). Shape and
# fault are pinned (as the fast tier pins them), so a shape or fault added to the
# generator leaves these scenarios as they are. Without a fault, lora-subset preloads the
# adapter on one server of three, so the old EPP's misses (an adapter request that comes
# while no fresh scrape shows it running anywhere goes to any server) are many a run;
# either seed is enough
BREAKS = {
    "lora-preloaded-on-some-servers": (
        ((15, "lora-subset", "none"), (143, "lora-subset", "none")),
        "I1",
    ),
    "stack-replica-death-stops-the-stack": (((11, "stack-replicas", "epp-replica-kill"),), "I1"),
    "server-frozen-mid-stream": (((123, "plain", "sigstop-mid-stream"),), "I4"),
    # servers that count a token per byte (kv-events), half the prompts token ids; no
    # hang-up, no fault: every answer is known, so I7 is exact
    "token-id-prompts-mispriced": (((44, "kv-events", "none"),), "I7"),
}  # fmt: skip
# what each of those scenarios is, as it was checked against the old EPP
DRAWN = {
    15: "seed 15: shape lora-subset, fault none (target 0, after 26), 87 requests by 3 clients "
    "(stream 30%, hang-up 10%, 220 KB 0%, other models or headers 50%)",
    143: "seed 143: shape lora-subset, fault none (target 2, after 7), 42 requests by 3 clients "
    "(stream 30%, hang-up 0%, 220 KB 10%, other models or headers 50%)",
    11: "seed 11: shape stack-replicas, fault epp-replica-kill (target 1, after 20), 89 requests "
    "by 6 clients (stream 50%, hang-up 10%, 220 KB 0%, other models or headers 0%)",
    123: "seed 123: shape plain, fault sigstop-mid-stream (target 1, after 15), 66 requests by 5 "
    "clients (stream 30%, hang-up 10%, 220 KB 0%, other models or headers 0%)",
    44: "seed 44: shape kv-events, fault none (target 0, after 6), 47 requests by 4 clients "
    "(stream 50%, hang-up 0%, 220 KB 0%, other models or headers 0%, token ids 50%)",
}
# which prompts are token ids comes from a generator of its own, which the description
# does not show: (token-id prompts, ids) of the scenarios that send them
TOKEN_IDS = {44: (20, 5698)}
OLD = os.environ.get("EPP_SCENARIO_EPP_FROM", "")


@pytest.mark.parametrize("name", sorted(BREAKS))
def test_each_seed_still_draws_the_scenario_that_was_checked(name: str) -> None:
    """A generator that draws a workload differently moves the scenarios: find seeds
    that break the old EPP again with ``python -m tests.scenarios.replay SEED --shape S
    --fault F --epp-from CHECKOUT`` (docs/testing.md)."""
    for seed, shape, fault in BREAKS[name][0]:
        assert scenario(seed, shape, fault).describe() == DRAWN[seed]
        specs = requests(scenario(seed, shape, fault))
        ids = sum(bool(r.token_ids) for r in specs), sum(r.token_ids for r in specs)
        assert ids == TOKEN_IDS.get(seed, (0, 0))


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
    for seed, shape, fault in seeds:
        (tmp := tmp_path / str(seed)).mkdir()
        found = judge(scenario(seed, shape, fault), tmp, OtherCheckout(Path(OLD).resolve()))
        if any(line.startswith(f"{invariant}: ") for line in found.splitlines()):
            return
        reports.append(found or f"seed {seed}: every invariant held")
    pytest.fail(f"no seed broke {invariant} on the old EPP:\n" + "\n".join(reports))


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(540)
@pytest.mark.parametrize("name", sorted(BREAKS))
def test_this_tree_passes_the_same_seeds(name: str, tmp_path: Path) -> None:
    for seed, shape, fault in BREAKS[name][0]:
        (tmp := tmp_path / str(seed)).mkdir()
        found = judge(scenario(seed, shape, fault), tmp)
        assert not found, found
