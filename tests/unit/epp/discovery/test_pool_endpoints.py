"""InferencePool + pod JSON -> endpoints: the pure membership rules."""

from __future__ import annotations

import pytest

from epp.discovery.pool_endpoints import (
    ACTIVE_PORTS_ANNOTATION,
    ENGINE_KEY,
    PORT_DISCOVERY_ANNOTATION,
    PoolError,
    PoolSpec,
    is_ready,
    parse_pool,
    pod_endpoints,
)
from epp.types import Role
from tests.support.kube_objects import pod, pool

POOL = parse_pool(pool(target_ports=[8000, 8001]))


def addresses(spec: PoolSpec, obj: dict[str, object]) -> list[str]:
    return [e.address for e in pod_endpoints(spec, obj, "vllm").endpoints]


def test_parse_pool_reads_selector_and_ports() -> None:
    spec = parse_pool(pool(match_labels={"b": "2", "a": "1"}, target_ports=[8000, 8000, 9000]))
    assert spec.name == "qwen-pool" and spec.namespace == "default"
    assert spec.target_ports == (8000, 9000)
    assert spec.label_selector == "a=1,b=2"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({}, "spec.selector.matchLabels must be a non-empty map"),
        ({"selector": {"matchLabels": {}}}, "non-empty"),
        ({"selector": {"matchLabels": {"a": 1}}}, "strings to strings"),
        (
            {"selector": {"matchLabels": {"a": "b"}}, "targetPorts": [{"number": 0}]},
            "spec.targetPorts[0].number",
        ),
        (
            {"selector": {"matchLabels": {"a": "b"}}, "targetPorts": [{"number": "80"}]},
            "spec.targetPorts[0].number",
        ),
    ],
)
def test_parse_pool_rejects_unusable_specs(spec: dict[str, object], message: str) -> None:
    obj = {"metadata": {"name": "p", "namespace": "ns"}, "spec": spec}
    with pytest.raises(PoolError, match="InferencePool ns/p") as exc:
        parse_pool(obj)
    assert message in str(exc.value)


def test_target_ports_times_ready_pod() -> None:
    assert addresses(POOL, pod("a", "10.0.0.1")) == ["10.0.0.1:8000", "10.0.0.1:8001"]


@pytest.mark.parametrize(
    "change",
    [
        lambda p: p["status"]["conditions"][0].update(status="False"),
        lambda p: p["status"].pop("podIP"),
        lambda p: p["metadata"].update(deletionTimestamp="2025-01-01T00:00:00Z"),
        lambda p: p["metadata"]["labels"].update(app="other"),
        lambda p: p["status"].update(conditions=[]),
    ],
    ids=["unready", "no-ip", "terminating", "not-selected", "no-conditions"],
)
def test_pods_that_cannot_serve_make_no_endpoints(change: object) -> None:
    obj = pod("a")
    change(obj)  # type: ignore[operator]
    assert addresses(POOL, obj) == []


def test_is_ready_needs_ready_condition_true() -> None:
    assert is_ready(pod("a"))
    assert not is_ready(pod("a", ready=False))


def test_active_ports_limit_target_ports_and_bad_tokens_are_reported() -> None:
    obj = pod("a", annotations={ACTIVE_PORTS_ANNOTATION: "8001, 9999"})
    assert addresses(POOL, obj) == ["10.0.0.1:8001"]
    obj = pod("a", annotations={ACTIVE_PORTS_ANNOTATION: "80x0,8000"})
    result = pod_endpoints(POOL, obj, "vllm")
    assert [e.port for e in result.endpoints] == [8000]
    assert result.problems == (
        f"pod default/a: annotation {ACTIVE_PORTS_ANNOTATION} entry '80x0' is not a port; skipped",
    )


def test_empty_active_ports_means_no_live_port() -> None:
    assert addresses(POOL, pod("a", annotations={ACTIVE_PORTS_ANNOTATION: ""})) == []


def test_role_from_label_engine_from_label_or_annotation_labels_copied() -> None:
    obj = pod("a", labels={"llm-d.ai/role": "prefill", "zone": "z1"})
    (first, _) = pod_endpoints(POOL, obj, "vllm").endpoints
    assert first.role is Role.PREFILL and first.engine == "vllm"
    assert first.labels["zone"] == "z1" and first.labels["app"] == "qwen"
    obj = pod("a", annotations={ENGINE_KEY: "sglang"}, labels={"llm-d.ai/role": "both"})
    assert {(e.engine, e.role) for e in pod_endpoints(POOL, obj, "vllm").endpoints} == {
        ("sglang", Role.BOTH)
    }
    obj = pod("a", labels={ENGINE_KEY: "trtllm"}, annotations={ENGINE_KEY: "sglang"})
    assert {e.engine for e in pod_endpoints(POOL, obj, "vllm").endpoints} == {"trtllm"}


def test_unlabelled_pods_decode() -> None:
    assert {e.role for e in pod_endpoints(POOL, pod("a"), "vllm").endpoints} == {Role.DECODE}


def test_unknown_role_leaves_the_pod_out_and_says_so() -> None:
    result = pod_endpoints(POOL, pod("a", labels={"llm-d.ai/role": "encode"}), "vllm")
    assert result.endpoints == ()
    assert len(result.problems) == 2
    assert result.problems[0].startswith("pod default/a port 8000: unknown role 'encode'")


def test_unknown_engine_falls_back_to_default_and_is_reported() -> None:
    result = pod_endpoints(POOL, pod("a", annotations={ENGINE_KEY: "tgi"}), "sglang")
    assert {e.engine for e in result.endpoints} == {"sglang"}
    assert "'tgi' is not a known engine" in result.problems[0]


def test_port_discovery_replaces_target_ports_with_attributes() -> None:
    obj = pod(
        "launcher",
        labels={"llm-d.ai/role": "decode"},
        annotations={ACTIVE_PORTS_ANNOTATION: "8000"},
        port_discovery=[
            {"inferencePool": "qwen-pool", "number": 8007, "attributes": {"role": "prefill"}},
            {"inferencePool": "qwen-pool", "number": 8008},
            {"inferencePool": "other-pool", "number": 8009},
        ],
    )
    result = pod_endpoints(POOL, obj, "vllm")
    assert result.problems == ()
    assert [(e.port, e.role) for e in result.endpoints] == [
        (8007, Role.PREFILL),
        (8008, Role.DECODE),
    ]
    assert result.endpoints[0].labels["role"] == "prefill"


def test_port_discovery_for_other_pools_only_gives_nothing_here() -> None:
    """A pod that declares its servers serves exactly those: none of them is ours."""
    obj = pod("a", port_discovery=[{"inferencePool": "other-pool", "number": 8009}])
    assert addresses(POOL, obj) == []


def test_pool_without_target_ports_uses_port_discovery_only() -> None:
    spec = parse_pool({**pool(), "spec": {"selector": {"matchLabels": {"app": "qwen"}}}})
    assert spec.target_ports == ()
    assert addresses(spec, pod("plain")) == []
    obj = pod("b", port_discovery=[{"inferencePool": "qwen-pool", "number": 8100}])
    assert addresses(spec, obj) == ["10.0.0.1:8100"]


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ({"inferencePool": "qwen-pool", "number": "8007"}, "[1].number '8007' is not a port"),
        ({"inferencePool": "qwen-pool", "number": 70000}, "[1].number 70000 is not a port"),
        ({"inferencePool": "qwen-pool", "number": True}, "[1].number True is not a port"),
        ({"number": 8007}, "[1] needs an inferencePool name"),
        (["qwen-pool", 8007], "[1] needs an inferencePool name"),
        (
            {"inferencePool": "qwen-pool", "number": 8007, "attributes": {"role": 1}},
            "[1].attributes must map strings to strings",
        ),
        ({"inferencePool": "qwen-pool", "number": 8100}, "[1] repeats port 8100"),
    ],
)
def test_malformed_port_discovery_entry_drops_only_itself(entry: object, problem: str) -> None:
    good = {"inferencePool": "qwen-pool", "number": 8100}
    obj = pod("a", port_discovery=[good, entry])  # type: ignore[list-item]
    result = pod_endpoints(POOL, obj, "vllm")
    assert [e.address for e in result.endpoints] == ["10.0.0.1:8100"]
    (message,) = result.problems
    assert message.startswith(f"pod default/a: annotation {PORT_DISCOVERY_ANNOTATION}")
    assert problem in message


@pytest.mark.parametrize(
    ("text", "problem"),
    [("[{oops", "is not valid JSON"), ('{"inferencePool": "qwen-pool"}', "must be a JSON list")],
)
def test_unreadable_port_discovery_gives_no_endpoints_and_says_why(text: str, problem: str) -> None:
    """Not targetPorts: with port discovery in use, nothing may listen there."""
    obj = pod("a", annotations={PORT_DISCOVERY_ANNOTATION: text})
    result = pod_endpoints(POOL, obj, "vllm")
    assert result.endpoints == ()
    (message,) = result.problems
    assert message.startswith("pod default/a:") and problem in message


def test_unknown_role_attribute_drops_that_port_only() -> None:
    obj = pod(
        "a",
        port_discovery=[
            {"inferencePool": "qwen-pool", "number": 8007, "attributes": {"role": "encoder"}},
            {"inferencePool": "qwen-pool", "number": 8008, "attributes": {"role": "prefill"}},
        ],
    )
    result = pod_endpoints(POOL, obj, "vllm")
    assert [(e.port, e.role) for e in result.endpoints] == [(8008, Role.PREFILL)]
    assert "port 8007: unknown role 'encoder'" in result.problems[0]


def test_ipv6_pod_ip_is_bracketed() -> None:
    assert addresses(POOL, pod("a", "fd00::5"))[0] == "[fd00::5]:8000"
