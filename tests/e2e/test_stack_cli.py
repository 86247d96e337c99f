"""`epp stack` as a user runs it: banner with URLs, working requests, Ctrl-C stops all."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import orjson
import pytest

from epp_harness.procs import epp_argv
from epp_harness.stack import check_ports_free
from tests.support.http import request
from tests.support.stackcli import processes_using
from tests.support.wait import wait_for

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize(
    ("flags", "grpc_security"), [([], "plaintext"), (["--epp-tls"], "TLS, self-signed")]
)
def test_stack_starts_serves_and_stops_everything_on_ctrl_c(
    tmp_path: Path, flags: list[str], grpc_security: str
) -> None:
    out = tmp_path / "stack.out"
    workdir = tmp_path / "work"
    argv = epp_argv(
        "stack", "--servers", "2", "--envoy-port", "0", "--envoy-admin-port", "0",
        "--grpc-port", "0", "--http-port", "0", "--time-scale", "0", "--workdir", str(workdir),
        *flags,
    )  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "ADMIN_API_KEY"}
    with open(out, "wb") as f:
        proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, env=env)
    try:
        wait_for(lambda: b"Ctrl-C stops everything" in out.read_bytes(), 60, "the banner")
        banner = out.read_text()
        url = banner.split("Envoy (send requests here)", 1)[1].split()[0]
        assert url.startswith("http://127.0.0.1:")
        grpc_line = banner.split("EPP ext_proc gRPC", 1)[1].splitlines()[0]
        assert grpc_line.endswith(f"({grpc_security})")
        body = orjson.dumps({"model": "sim-model", "prompt": "hi", "max_tokens": 2})
        assert request(f"{url}/v1/completions", body)[0] == 200
        status_url = banner.split("EPP admin API", 1)[1].split()[0].rstrip(",")
        status, _, raw = request(status_url)
        assert status == 200 and orjson.loads(raw)["decode_node_count"] == 2
        assert "read-only: set ADMIN_API_KEY to allow changes" in banner
        assert "  EPP config                  built in (`epp config show`)\n" in banner
        # plain servers only: no P/D coordinator to name
        assert "  model servers               model sim-model\n" in banner
        assert "coordinator" not in banner
        assert len(processes_using(workdir)) >= 3  # simulators, EPP, Envoy
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
        assert "stopped." in out.read_text()
        assert wait_for(lambda: not processes_using(workdir), 10, "children to exit") is True
    finally:
        if proc.poll() is None:
            proc.kill()


def test_taken_port_is_named_by_flag(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        from epp_harness.procs import ProcessFailed

        with pytest.raises(
            ProcessFailed, match=f"port {port} \\(--envoy-port\\) is already in use"
        ):
            check_ports_free({"--envoy-port": port})
        result = subprocess.run(
            epp_argv("stack", "--envoy-port", str(port), "--workdir", str(tmp_path)),
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert result.returncode == 1
    assert "--envoy-port" in result.stderr and "already in use" in result.stderr


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (None, "invalid config: {path}: cannot read config file: No such file or directory"),
        ("plugins: [\n", "invalid config: {path}:2:1: invalid YAML"),
        ("plugins:\n- type: nope-scorer\n", "plugins[0].type: unknown plugin type 'nope-scorer'"),
    ],
    ids=["missing", "not-yaml", "unknown-plugin"],
)
def test_a_bad_config_stops_the_stack_before_any_child_starts(
    tmp_path: Path, config: str | None, message: str
) -> None:
    path = tmp_path / "epp.yaml"
    if config is not None:
        path.write_text(config)
    workdir = tmp_path / "work"  # every child writes its log here
    result = subprocess.run(
        epp_argv(
            "stack", "--config", str(path), "--workdir", str(workdir), "--envoy-port", "0",
            "--envoy-admin-port", "0", "--grpc-port", "0", "--http-port", "0",
        ),
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    (line,) = result.stderr.splitlines()  # one clear message
    assert line.startswith("epp stack: ") and message.format(path=path) in line
    assert "still running" not in result.stderr
    assert result.stdout == ""  # not even "starting ..."
    assert not workdir.exists()  # no child started, nothing written
