"""Which namespace `epp serve --pool-name` follows when --pool-namespace is not given:
kubectl's rules (flag, in-cluster service account, kubeconfig context, default)."""

from __future__ import annotations

from pathlib import Path

import pytest

from epp.discovery.poolref import PoolRef, context_namespace
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
