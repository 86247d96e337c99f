"""Which namespace `epp serve --pool-name` follows when --pool-namespace is not given:
$NAMESPACE (the llm-d Router chart sets it), then kubectl's rules (flag, in-cluster
service account, kubeconfig context, default); the standalone --endpoint-selector."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from epp.discovery.poolref import (
    NAMESPACE_ENV,
    PoolRef,
    SelectorRef,
    context_namespace,
    parse_selector,
)
from tests.support.kube_server import write_kubeconfig


def test_the_current_contexts_namespace_is_read_from_the_kubeconfig() -> None:
    text = """
current-context: b
contexts:
- name: a
  context: {cluster: c, namespace: team-a}
- name: b
  context: {cluster: c, namespace: team-b}
"""
    assert context_namespace(text) == "team-b"


@pytest.mark.parametrize(
    "text",
    [
        "",
        "current-context: a\ncontexts:\n- name: a\n  context: {cluster: c}\n",  # none named
        "current-context: missing\ncontexts:\n- name: a\n  context: {namespace: x}\n",
        "contexts: [1, 2]\n",
        "- just\n- a list\n",
        "{not: [valid yaml",
        "current-context: a\ncontexts:\n- name: a\n  context: {namespace: ''}\n",
    ],
)
def test_kubeconfigs_without_a_usable_namespace_yield_none(text: str) -> None:
    assert context_namespace(text) is None


def test_the_flag_wins_then_the_kubeconfig_then_default(tmp_path: Path) -> None:
    config = write_kubeconfig(tmp_path / "kubeconfig", "http://127.0.0.1:1", namespace="ml")
    assert PoolRef("pool", "explicit", config).resolved_namespace() == "explicit"
    assert PoolRef("pool", None, config).resolved_namespace() == "ml"
    assert PoolRef("pool", None, tmp_path / "absent").resolved_namespace() == "default"


def test_without_kubeconfig_flag_kubeconfig_env_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = write_kubeconfig(tmp_path / "kc", "http://127.0.0.1:1", namespace="from-env")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", f"{config}:{tmp_path / 'other'}")
    assert PoolRef("pool").resolved_namespace() == "from-env"
    monkeypatch.setenv("KUBECONFIG", "")
    monkeypatch.setenv("HOME", str(tmp_path))  # ~/.kube/config absent here
    assert PoolRef("pool").resolved_namespace() == "default"


@pytest.fixture(autouse=True)
def _no_namespace_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(NAMESPACE_ENV, raising=False)


def test_namespace_env_comes_after_the_flag_before_the_kubeconfig(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = write_kubeconfig(tmp_path / "kubeconfig", "http://127.0.0.1:1", namespace="ml")
    monkeypatch.setenv(NAMESPACE_ENV, "from-chart")
    assert PoolRef("pool", None, config).resolved_namespace() == "from-chart"
    assert PoolRef("pool", "explicit", config).resolved_namespace() == "explicit"
    selector = SelectorRef((("app", "x"),), (8000,), None, config)
    assert selector.resolved_namespace() == "from-chart"


@pytest.mark.parametrize(
    ("text", "pairs"),
    [
        ("app=vllm", (("app", "vllm"),)),
        ("tier==gpu, app=vllm,", (("app", "vllm"), ("tier", "gpu"))),
        ("a=", (("a", ""),)),
    ],
)
def test_equality_selectors_parse(text: str, pairs: tuple[tuple[str, str], ...]) -> None:
    assert parse_selector(text) == pairs
    assert SelectorRef(pairs, (8000,)).label_selector == ",".join(f"{k}={v}" for k, v in pairs)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "--endpoint-selector is empty"),
        ("app!=x", "'app!=x' is not key=value"),
        ("env in (a,b)", "is not key=value"),
        ("app", "'app' is not key=value"),
        ("=x", "'=x' is not key=value"),
    ],
)
def test_other_selectors_are_refused_by_name(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_selector(text)
