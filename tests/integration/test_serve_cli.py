"""`epp serve` refuses bad input at start-up with a precise message and exit code."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

from epp.procs import epp_argv


def serve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        epp_argv("serve", "--grpc-port", "0", "--http-port", "0", *args),
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_bad_config_exits_2_naming_file_and_key(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("plugins:\n- type: prefix-cache-scorer\n  parameters: {blockSize: 0}\n")
    result = serve("--config", str(bad))
    assert result.returncode == 2
    assert f"{bad}: plugin 'prefix-cache-scorer' parameters.blockSize: must be >= 1" in (
        result.stderr
    )


def test_malformed_endpoint_is_a_usage_error() -> None:
    result = serve("--endpoint", "not-an-address")
    assert result.returncode == 2
    assert "malformed address 'not-an-address'" in result.stderr


def test_taken_port_exits_1_with_the_address() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        result = subprocess.run(
            epp_argv("serve", "--grpc-port", "0", "--http-port", str(port)),
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert result.returncode == 1
    assert f"HTTP port 127.0.0.1:{port}" in result.stderr
