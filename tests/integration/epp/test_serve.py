"""`epp serve` refuses bad input at start-up with a precise message and exit code."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from epp_harness.procs import epp_argv, start_epp
from tests.support.certs import server_files
from tests.support.http import metric_sum, request
from tests.support.startup import run_epp_many

PORTS = ("--grpc-port", "0", "--http-port", "0", "--grpc-health-port", "0")


def serve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        epp_argv("serve", *PORTS, *args), capture_output=True, text=True, timeout=30
    )


def serve_each(*flag_sets: Sequence[str]) -> list[subprocess.CompletedProcess[str]]:
    """``epp serve FLAGS`` for each of ``flag_sets``, each in a process of its own, the
    server imported once for all (tests/support/startup.py): for command lines that
    end during start-up."""
    return run_epp_many([["serve", *PORTS, *flags] for flags in flag_sets])


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
            epp_argv(
                "serve", "--grpc-port", "0", "--http-port", str(port), "--grpc-health-port", "0"
            ),
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert result.returncode == 1
    assert f"HTTP port 127.0.0.1:{port}" in result.stderr


def test_role_flags_and_config_endpoints_join_the_pool(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("endpoints: [{address: '127.0.0.1:1004', role: both}]\n")
    proc = start_epp(
        tmp_path, "epp", "serve", "--grpc-port", "0", "--http-port", "0", "--grpc-health-port", "0",
        "--config", str(config), "--prefill", "127.0.0.1:1001",
        "--decode", "127.0.0.1:1002", "--endpoint", "127.0.0.1:1003",
        "--coordinator", "kv-pool", "--eject-after", "0",  # nothing listens there
    )  # fmt: skip
    try:
        _, _, body = request(f"http://127.0.0.1:{proc.info['http_port']}/metrics")
        text = body.decode()
        assert metric_sum(text, 'epp_endpoints{role="prefill"}') == 1
        assert metric_sum(text, 'epp_endpoints{role="decode"}') == 2
        assert metric_sum(text, 'epp_endpoints{role="prefill-decode"}') == 1
    finally:
        proc.stop()
    assert "coordinator kv-pool" in (tmp_path / "epp.log").read_text()


def test_unknown_coordinator_is_a_usage_error() -> None:
    result = serve("--coordinator", "pigeon")
    assert result.returncode == 2
    assert "invalid choice: 'pigeon'" in result.stderr


def test_pool_flags_without_pool_name_are_a_usage_error(tmp_path: Path) -> None:
    result = serve("--kubeconfig", str(tmp_path / "k"))
    assert result.returncode == 2
    assert "--kubeconfig needs --pool-name, --endpoint-selector or --metrics-endpoint-a" in (
        result.stderr
    )
    result = serve("--pool-namespace", "ns")
    assert result.returncode == 2
    assert "--pool-namespace needs --pool-name or --endpoint-selector" in result.stderr


def test_unreadable_kubeconfig_exits_1_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "missing-kubeconfig"
    result = serve("--pool-name", "p", "--kubeconfig", str(missing))
    assert result.returncode == 1
    assert f"cannot start: Kubernetes client config ({missing})" in result.stderr


USAGE_ERRORS = [
    (["--tls-cert-file", "c.pem"], "--tls-cert-file and --tls-key-file go together"),
    (["--tls-key-file", "k.pem"], "--tls-cert-file and --tls-key-file go together"),
    (
        ["--tls-self-signed", "--tls-cert-file", "c.pem", "--tls-key-file", "k.pem"],
        "--tls-self-signed and certificate files (--tls-cert-file, --cert-path) exclude",
    ),
    (["--cert-path", "d", "--tls-cert-file", "c", "--tls-key-file", "k"], "exclude each"),
    (["--secure-serving=false", "--tls-self-signed"], "--secure-serving=false contradicts"),
    (["--secure-serving=maybe"], "not a boolean: 'maybe' (use true or false)"),
    (["--http-tls"], "--http-tls serves the gRPC port's certificate, but the gRPC port is"),
    (["--metrics-cert-dir", "d"], "enables TLS on the metrics port without authentication"),
    (
        ["--tls-self-signed", "--http-tls", "--metrics-cert-dir", "d"],
        "--http-tls and --metrics-cert-dir exclude each other",
    ),
    (["--pool-group", "inference.networking.x-k8s.io"], "only inference.networking.k8s.io"),
    (["--pool-name", "p", "--endpoint-selector", "a=b"], "exclude each other: give one"),
    (["--endpoint-selector", "app=x"], "--endpoint-selector needs --endpoint-target-ports"),
    (["--endpoint-target-ports", "8000"], "--endpoint-target-ports needs --endpoint-selector"),
    (["--endpoint-target-ports", "0"], "port must be 1-65535, got 0"),
    (
        ["--endpoint-selector", "env in (a)", "--endpoint-target-ports", "8000"],
        "is not key=value (only equality terms are supported)",
    ),
    (["--config-text", "{}", "--config-file", "x"], "--config-text exclude each other"),
    (["--zap-encoder", "xml"], "invalid choice: 'xml'"),
    (["--workers", "2", "--peer-load-bind", "ipc://x"], "and --workers > 1 exclude each"),
    (["--peer-load-bind", "localhost:9004"], "give tcp://HOST:PORT or ipc://PATH"),
    (["--peer-load-peers", "tcp://a:1,udp://b:2"], "--peer-load-peers: 'udp://b:2': give"),
    (["-v", "-1"], "must be >= 0, got -1"),
]


@pytest.fixture(scope="module")
def usage_errors() -> dict[tuple[str, ...], subprocess.CompletedProcess[str]]:
    """Every case of USAGE_ERRORS run once (one import of the server for all)."""
    flag_sets = [tuple(flags) for flags, _ in USAGE_ERRORS]
    return dict(zip(flag_sets, serve_each(*flag_sets), strict=True))


@pytest.mark.parametrize(("flags", "message"), USAGE_ERRORS)
def test_bad_flag_combinations_are_usage_errors(
    usage_errors: dict[tuple[str, ...], subprocess.CompletedProcess[str]],
    flags: list[str],
    message: str,
) -> None:
    result = usage_errors[tuple(flags)]
    assert result.returncode == 2
    assert message in result.stderr


def test_bad_files_stop_the_start_naming_the_file(tmp_path: Path) -> None:
    files = server_files(tmp_path)
    (tmp_path / "other").mkdir()
    other = server_files(tmp_path / "other")
    (tmp_path / "weak").mkdir()
    weak = server_files(tmp_path / "weak", rsa_bits=1024)  # below OpenSSL's default level
    missing = tmp_path / "missing.pem"
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    cases = [
        (missing, files.key_file, f"TLS certificate file {missing}: No such file"),
        (files.cert_file, missing, f"TLS key file {missing}: No such file"),
        (garbage, files.key_file, f"TLS certificate file {garbage}: no PEM certificate"),
        (files.cert_file, garbage, f"TLS key file {garbage}: no usable PEM private key"),
        (
            files.cert_file,
            other.key_file,
            f"TLS key file {other.key_file} does not match the certificate in {files.cert_file}",
        ),
        (
            weak.cert_file,
            weak.key_file,
            f"TLS certificate file {weak.cert_file} with key file {weak.key_file}: "
            "OpenSSL refuses them: EE_KEY_TOO_SMALL",
        ),
    ]
    # grpcio (BoringSSL) would take the weak key: both transports refuse it up front
    weak_flags = ("--tls-cert-file", str(weak.cert_file), "--tls-key-file", str(weak.key_file))
    *results, weak_grpcio = serve_each(
        *(("--tls-cert-file", str(cert), "--tls-key-file", str(key)) for cert, key, _ in cases),
        ("--transport", "grpcio", *weak_flags),
    )
    for (_, _, message), result in zip(cases, results, strict=True):
        assert result.returncode == 1, result.stderr
        assert f"cannot start: {message}" in result.stderr
    assert weak_grpcio.returncode == 1, weak_grpcio.stderr
    assert "OpenSSL refuses them" in weak_grpcio.stderr


def test_an_encrypted_key_is_refused_naming_the_file(tmp_path: Path) -> None:
    files = server_files(tmp_path)
    key = serialization.load_pem_private_key(files.key_file.read_bytes(), password=None)
    locked = tmp_path / "locked.key"
    locked.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret"),
        )
    )
    result = serve("--tls-cert-file", str(files.cert_file), "--tls-key-file", str(locked))
    assert result.returncode == 1
    assert f"cannot start: TLS key file {locked}: encrypted keys are not supported" in (
        result.stderr
    )
