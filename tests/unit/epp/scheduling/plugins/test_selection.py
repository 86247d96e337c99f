"""The conformance suite's endpoint selection header, on plain snapshots."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from epp import config
from epp.common.params import Params
from epp.scheduling.base import CycleContext
from epp.scheduling.plugins.selection import (
    SELECTION_HEADER,
    endpoint_selection_header_filter,
    selection_tokens,
)
from epp.types import Endpoint, EndpointState, InferenceRequest, Snapshot

# two pods: 10.0.0.1 serves three data-parallel ranks, 10.0.0.2 one port; one IPv6 pod
ENDPOINTS = [
    EndpointState(Endpoint("10.0.0.1", 3000)),
    EndpointState(Endpoint("10.0.0.1", 3002)),
    EndpointState(Endpoint("10.0.0.1", 3004)),
    EndpointState(Endpoint("10.0.0.2", 3000)),
    EndpointState(Endpoint("fd00::5", 3000)),
]
ALL = [s.address for s in ENDPOINTS]
CONFIG = Path(__file__).resolve().parents[5] / "configs" / "conformance.yaml"


def kept(header: str | None) -> list[str]:
    headers = {} if header is None else {SELECTION_HEADER: header}
    request = InferenceRequest("r", "m", "/v1/completions", headers=headers)
    ctx = CycleContext(request, Snapshot(tuple(ENDPOINTS), {}, {}), 0.0, random.Random(0))
    f = endpoint_selection_header_filter(Params("test", {}))
    return [s.address for s in f.filter(ctx, ENDPOINTS)]


@pytest.mark.parametrize(
    ("value", "tokens"),
    [
        ("10.0.0.1", {"10.0.0.1"}),
        (" 10.0.0.1 , 10.0.0.2:3000 ", {"10.0.0.1", "10.0.0.2:3000"}),
        ("10.0.0.1,,10.0.0.1, ", {"10.0.0.1"}),
        ("", set()),
        (" , ,", set()),
    ],
)
def test_tokens_are_trimmed_and_empty_ones_dropped(value: str, tokens: set[str]) -> None:
    assert selection_tokens(value) == tokens


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        # a bare IP: every port (data-parallel rank) of that pod
        ("10.0.0.1", ALL[:3]),
        # IP:port: that endpoint only; tokens may mix both forms
        ("10.0.0.1:3002", [ALL[1]]),
        ("10.0.0.2, 10.0.0.1:3004", [ALL[2], ALL[3]]),
        ("10.0.0.1:3000,10.0.0.1:3004", [ALL[0], ALL[2]]),
        # IPv6: bare, or bracketed with its port
        ("fd00::5", [ALL[4]]),
        ("[fd00::5]:3000", [ALL[4]]),
        # tokens that match nothing are ignored beside one that matches
        ("10.0.0.9,10.0.0.2,not an address,10.0.0.1:", [ALL[3]]),
    ],
)
def test_the_header_restricts_the_candidates(header: str, expected: list[str]) -> None:
    assert kept(header) == expected


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        " , ",
        "10.0.0.9",  # an unknown pod
        "10.0.0.1:9999",  # a port the pod does not serve
        "10.0.0.1:abc,10.0.0",  # malformed
        "fd00::5:3000",  # an IPv6 address with a port needs brackets
        "10.0.0.1/32",
    ],
)
def test_a_header_that_matches_nothing_keeps_every_candidate(header: str | None) -> None:
    assert kept(header) == ALL


def test_the_shipped_conformance_config_runs_the_filter() -> None:
    text = CONFIG.read_text()
    assert config.load_text(text, str(CONFIG)).conformance.echo_served_endpoint
    scheduler = config.build_scheduler(text)
    request = InferenceRequest(
        "r", "m", "/v1/completions", headers={SELECTION_HEADER: "10.0.0.1:3002"}
    )
    snapshot = Snapshot(tuple(ENDPOINTS), {}, {})
    for seed in range(20):
        result = scheduler.schedule(request, snapshot, random.Random(seed))
        assert result.primary.address == "10.0.0.1:3002"
