"""Which InferenceObjectives apply to a pool, and the priority each gives."""

from __future__ import annotations

from typing import Any

import pytest

from epp.discovery.objectives import ObjectiveError, objective_priority
from tests.support.kube_objects import objective

GOLD = {"tier": "gold", "region": "eu"}


def priority(obj: dict[str, Any], labels: dict[str, str] | None = None) -> int | None:
    return objective_priority(obj, "qwen-pool", GOLD if labels is None else labels)


def test_pool_references_old_and_new() -> None:
    assert priority(objective("a", 10)) == 10
    assert priority(objective("a", -5)) == -5  # negative: sheddable
    assert priority(objective("a")) == 0  # unset: 0, as the API says
    assert priority(objective("a", 3, pool_ref="other-pool")) is None
    refs = [{"name": "other-pool"}, {"name": "qwen-pool"}]
    assert priority(objective("a", 4, pool_ref=None, poolRefs=refs)) == 4
    alien = {"group": "example.com", "kind": "InferencePool", "name": "qwen-pool"}
    assert priority(objective("a", 4, pool_ref=None, poolRefs=[alien])) is None


@pytest.mark.parametrize(
    ("selector", "applies"),
    [
        ({"matchLabels": {"tier": "gold"}}, True),
        ({"matchLabels": {"tier": "silver"}}, False),
        ({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["gold"]}]}, True),
        ({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["gold"]}]}, False),
        ({"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["a"]}]}, True),
        ({"matchExpressions": [{"key": "region", "operator": "Exists"}]}, True),
        ({"matchExpressions": [{"key": "region", "operator": "DoesNotExist"}]}, False),
        (
            {
                "matchLabels": {"region": "eu"},
                "matchExpressions": [{"key": "tier", "operator": "In", "values": ["x"]}],
            },
            False,
        ),
    ],
)
def test_pool_selector_matches_the_pools_labels(selector: dict[str, Any], applies: bool) -> None:
    obj = objective("a", 7, pool_ref=None, poolSelector=selector)
    assert priority(obj) == (7 if applies else None)


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ({"priority": "high"}, "spec.priority 'high' is not an integer"),
        ({"priority": True}, "is not an integer"),
        ({"poolRefs": [{"kind": "InferencePool"}]}, "a pool reference without a name"),
        (
            {"poolSelector": {"matchExpressions": [{"key": "k", "operator": "Gt"}]}},
            "unsupported expression",
        ),
    ],
)
def test_malformed_objectives_say_what_is_wrong(spec: dict[str, Any], problem: str) -> None:
    obj = objective("bad", pool_ref=None, **spec)
    with pytest.raises(ObjectiveError, match="InferenceObjective default/bad") as info:
        priority(obj)
    assert problem in str(info.value)
