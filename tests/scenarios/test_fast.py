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

# (seed, shape, fault), each cut short: every shape and every fault at least once; each
# seed draws streams, a hang-up share and 220 KB prompts (and, for the metrics fault, a
# slow /metrics)
FAST = (
    (54, "plain", "sigkill-at-once"),
    (181, "lora-subset", "sigstop-at-once"),
    (56, "lora-registered", "restart-new-port"),
    (75, "lora-on-demand", "sigstop-at-once"),
    (112, "model-rewrite", "admin-remove-add"),
    (41, "workers-2", "epp-worker-kill"),
    (78, "stack-replicas", "epp-replica-kill"),
    (115, "replicas", "epp-replica-kill"),
    (152, "pd-nixl", "metrics-fault"),
    (117, "pd-sidecar", "sigstop-mid-stream"),
    (82, "pd-concurrent", "fault-status"),
    (191, "pd-kv-pool", "restart-same-port"),
    (205, "pd-deferred", "sigkill-mid-stream"),
    (103, "kv-events", "kv-publisher-restart"),
    (86, "flow-control", "fault-status"),
    (33, "flow-control-off", "none"),
    (88, "tls", "envoy-restart"),
    (71, "fail-open", "epp-replica-kill"),
)

# one scenario at its full length, for the workloads a short one leaves out: turns of
# conversations (60 % of its 42 requests, as chat) and a burst of 16 requests at once
# into a pool of three servers that take one request each, the rest waiting in the EPP
LONG = (75, "flow-control", "sigstop-at-once")


def test_the_fast_tier_covers_every_shape_and_fault() -> None:
    assert {shape for _, shape, _ in FAST} == set(SHAPES)
    assert {fault for _, _, fault in FAST} >= set(FAULTS) - {"none"}
    assert all(fault in FAULTS_OF[shape] for _, shape, fault in FAST)


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    ("seed", "shape", "fault"), FAST, ids=[f"seed_{s}-{shape}-{f}" for s, shape, f in FAST]
)
def test_scenario(seed: int, shape: str, fault: str, tmp_path: Path) -> None:
    found = judge(scenario(seed, shape, fault, short=True), tmp_path)
    assert not found, found


@pytest.mark.timeout(180)
def test_a_long_scenario_with_conversations_and_a_burst(tmp_path: Path) -> None:
    seed, shape, fault = LONG
    s = scenario(seed, shape, fault)
    assert s.workload.session_share and s.workload.burst
    found = judge(s, tmp_path)
    assert not found, found
