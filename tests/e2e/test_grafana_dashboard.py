"""The Grafana dashboard (deploy/grafana/) asks only for series a live EPP has: every
metric name in every panel's query is on /metrics after traffic through real Envoy."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from epp_harness.stack import LocalStack
from tests.support.live_metrics import samples, stack_with_traffic

pytestmark = pytest.mark.e2e

DASHBOARDS = sorted((Path(__file__).resolve().parents[2] / "deploy" / "grafana").glob("*.json"))
# PromQL words that look like metric names
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or",
            "unless", "bool", "offset"}  # fmt: skip


def queries(path: Path) -> list[tuple[str, str]]:
    """(panel title, expr) of every target of every panel, rows' panels included."""
    doc: dict[str, Any] = json.loads(path.read_text())
    found = []
    stack = list(doc["panels"])
    while stack:
        panel = stack.pop()
        stack.extend(panel.get("panels", []))
        found.extend((panel["title"], t["expr"]) for t in panel.get("targets", []))
    return found


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects."""
    text = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # ranges, $__rate_interval
    text = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", text)  # grouping labels
    names = set(re.findall(r"\b[A-Za-z_:][A-Za-z0-9_:]*\b(?!\s*\()", text))
    functions = set(re.findall(r"([A-Za-z_]+)\s*\(", text))
    return names - functions - KEYWORDS


def test_name_extraction() -> None:
    expr = (
        "histogram_quantile(0.95, sum by (le, model_name) "
        '(rate(llm_d_epp_request_duration_seconds_bucket{model_name=~"a.*"}[$__rate_interval])))'
        " / on (x) sum(epp_endpoints)"
    )
    assert metric_names(expr) == {"llm_d_epp_request_duration_seconds_bucket", "epp_endpoints"}


@pytest.fixture(scope="module")
def live() -> Iterator[LocalStack]:
    with stack_with_traffic() as stack:
        yield stack


def test_there_is_a_dashboard_and_it_is_importable() -> None:
    assert DASHBOARDS
    for path in DASHBOARDS:
        doc = json.loads(path.read_text())
        assert doc["title"] and doc["uid"] and doc["panels"]
        ids = [p["id"] for p in doc["panels"]]
        assert len(ids) == len(set(ids)), path
        assert {v["name"] for v in doc["templating"]["list"]} >= {"datasource"}
        assert all(e for _, e in queries(path))


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_every_queried_metric_is_on_a_live_epp(path: Path, live: LocalStack) -> None:
    present = set(samples(live))
    missing = {
        (title, name)
        for title, expr in queries(path)
        for name in metric_names(expr)
        if name not in present
    }
    assert not missing, f"queried but not on /metrics after traffic: {sorted(missing)}"
