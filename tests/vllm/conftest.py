"""The real-engine tier (`make test-vllm`, docs/test-vllm.md): real vLLM servers (from
the vLLM venv), and the EPP and Envoy started in front of them as the other tiers start
them (LocalStack, without simulators)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from epp_harness.envoyconfig import EnvoyOptions, baseline_config
from epp_harness.envoyproc import EnvoyProcess, write_config
from epp_harness.procs import ManagedProcess, spawn_epp
from epp_harness.stack import LocalStack
from tests.e2e.conftest import ephemeral
from tests.support.http import get_json
from tests.support.wait import wait_for
from tests.vllm import servers
from tests.vllm.servers import VllmServer

pytestmark = pytest.mark.e2e


def pytest_configure(config: pytest.Config) -> None:
    servers.PYTEST_CONFIG = config


@contextmanager
def epp_stack(
    workdir: Path,
    endpoint_args: Sequence[str],
    *,
    config: str | None = None,
    coordinator: str = "nixl",
    members: int | None = None,
) -> Iterator[LocalStack]:
    """Envoy + the EPP routing to the given servers (``--endpoint ADDR`` ...), with an
    EPP config (YAML text) if given; waits until the EPP has scraped every one (or
    ``members`` when the config lists them)."""
    workdir.mkdir(parents=True, exist_ok=True)
    args = list(endpoint_args)
    if config is not None:
        (workdir / "epp.yaml").write_text(config)
        args += ["--config", str(workdir / "epp.yaml")]
    opts = ephemeral(servers=0, coordinator=coordinator, epp_args=args, workdir=workdir)
    with LocalStack(opts) as stack:
        wanted = len(endpoint_args) // 2 if members is None else members
        wait_for(
            lambda: len([m for m in status(stack)["endpoints"] if "load" in m]) == wanted,
            timeout=30,
            what="the EPP's first scrape of every server",
        )
        yield stack


def status(stack: LocalStack) -> dict[str, Any]:
    doc: dict[str, Any] = get_json(f"{stack.epp_http_url}/status")
    return doc


@contextmanager
def round_robin_envoy(workdir: Path, servers: Sequence[VllmServer]) -> Iterator[str]:
    """Envoy alone, round robin over ``servers`` (the baseline); yields its URL."""
    workdir.mkdir(parents=True, exist_ok=True)
    opts = EnvoyOptions(listen_port=0, admin_port=0)
    config = baseline_config(opts, [("127.0.0.1", s.port) for s in servers])
    envoy = EnvoyProcess(write_config(config, workdir / "envoy.yaml"), workdir).start()
    try:
        yield f"http://127.0.0.1:{envoy.port}"
    finally:
        envoy.stop()


@contextmanager
def sidecar(workdir: Path, decode: VllmServer) -> Iterator[str]:
    """An ``epp sidecar`` in front of ``decode``; yields its address."""
    proc: ManagedProcess = spawn_epp(
        workdir, f"sidecar-{decode.name}", "sidecar", "--port", "0", "--decode", decode.address
    )
    try:
        info = proc.wait_ready()
        yield f"{info['host']}:{info['port']}"
    finally:
        proc.stop()
