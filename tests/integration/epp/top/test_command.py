"""`epp top --once` against a real `epp serve` whose HTTP port serves TLS
(`--tls-self-signed --http-tls`): it reads the port with `--insecure` or with the
certificate given by `--cacert`, and refuses an unverified one; an EPP that is not
there is exit 1 with the reason."""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from epp_harness.procs import ManagedProcess, start_epp


@pytest.fixture
def tls_epp(tmp_path: Path, closed_addresses: list[str]) -> Iterator[ManagedProcess]:
    proc = start_epp(
        tmp_path, "epp", "serve", "--grpc-port", "0", "--http-port", "0",
        "--grpc-health-port", "0", "--endpoint", closed_addresses[0], "--eject-after", "0",
        "--tls-self-signed", "--http-tls",
    )  # fmt: skip
    try:
        yield proc
    finally:
        proc.stop()


def top(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "120"}
    return subprocess.run(
        [sys.executable, "-m", "epp", "top", "--once", "--interval", "0.2", *args],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
    )


def test_reads_a_tls_http_port(
    tls_epp: ManagedProcess, tmp_path: Path, closed_addresses: list[str]
) -> None:
    url = f"https://127.0.0.1:{tls_epp.info['http_port']}"
    result = top("--url", url, "--insecure")
    assert result.returncode == 0, result.stderr
    assert f"epp top  {url}" in result.stdout
    row = next(line for line in result.stdout.splitlines() if line.startswith(closed_addresses[0]))
    assert row.split()[1:3] == ["decode", "healthy"]

    refused = top("--url", url)  # the system's CAs do not know a self-signed certificate
    assert refused.returncode == 1
    assert "certificate verify failed" in refused.stderr

    pem = tmp_path / "served.pem"
    pem.write_text(ssl.get_server_certificate(("127.0.0.1", tls_epp.info["http_port"])))
    result = top("--url", url.replace("127.0.0.1", "localhost"), "--cacert", str(pem))
    assert result.returncode == 0, result.stderr


def test_no_epp_there_is_exit_1_with_the_reason(closed_addresses: list[str]) -> None:
    result = top("--url", f"http://{closed_addresses[1]}")
    assert result.returncode == 1
    assert result.stderr.startswith(f"epp top: http://{closed_addresses[1]}/status: ")
    assert "Traceback" not in result.stderr
