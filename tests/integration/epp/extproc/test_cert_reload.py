"""`epp serve` follows its certificate files, each transport, both ports (`--http-tls`):
replace the files with another certificate and the next TLS handshake on either port
gets it, while a connection opened before keeps working; a bad new pair is logged and
the port keeps serving the certificate it has."""

from __future__ import annotations

import http.client
import shutil
import socket
import ssl
import time
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from grpc_health.v1 import health_pb2, health_pb2_grpc

from epp_harness.procs import ManagedProcess, start_epp
from tests.support.certs import ServerFiles, server_files
from tests.support.transports import transports

SERVING = health_pb2.HealthCheckResponse.SERVING


def leaf_der(files: ServerFiles) -> bytes:
    from cryptography.hazmat.primitives.serialization import Encoding

    return x509.load_pem_x509_certificates(files.cert_file.read_bytes())[0].public_bytes(
        Encoding.DER
    )


def served_der(port: int, alpn: str) -> bytes:
    """The certificate a new TLS connection to the port gets (not verified)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols([alpn])
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        context.wrap_socket(raw) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return der


def install(files: ServerFiles, live: Path) -> None:
    """Put a pair in place as a secret volume update does: each file swapped whole."""
    for source, name in ((files.key_file, "tls.key"), (files.cert_file, "tls.crt")):
        shutil.copyfile(source, live / f".{name}.new")
        (live / f".{name}.new").replace(live / name)


def wait_until_served(port: int, alpn: str, der: bytes, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while served_der(port, alpn) != der:
        assert time.monotonic() < deadline, f"port {port} still serves the old certificate"
        time.sleep(0.1)


def health(channel: grpc.Channel) -> int:
    reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    status: int = reply.status
    return status


@pytest.mark.parametrize("transport", transports())
def test_both_ports_serve_replaced_files_from_the_next_handshake(
    tmp_path: Path, closed_addresses: list[str], transport: str
) -> None:
    rsa_bits = 2048 if transport == "grpcio" else None
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    live = tmp_path / "live"
    live.mkdir()
    a, b = server_files(tmp_path / "a", rsa_bits), server_files(tmp_path / "b", rsa_bits)
    install(a, live)
    proc: ManagedProcess = start_epp(
        tmp_path, "epp", "serve", "--grpc-port", "0", "--http-port", "0",
        "--grpc-health-port", "0", "--endpoint", closed_addresses[0], "--eject-after", "0",
        "--transport", transport, "--cert-path", str(live), "--http-tls",
        "--tls-reload-seconds", "0.2",
    )  # fmt: skip
    try:
        grpc_port, http_port = proc.info["grpc_port"], proc.info["http_port"]
        assert served_der(grpc_port, "h2") == leaf_der(a)
        assert served_der(http_port, "http/1.1") == leaf_der(a)
        # connections opened with certificate A, before the change
        creds = grpc.ssl_channel_credentials(root_certificates=a.ca_pem)
        channel = grpc.secure_channel(f"127.0.0.1:{grpc_port}", creds)
        assert health(channel) == SERVING
        trusting_a = ssl.create_default_context(cadata=a.ca_pem.decode())
        https = http.client.HTTPSConnection("127.0.0.1", http_port, context=trusting_a)
        https.request("GET", "/ready")
        assert https.getresponse().read() == b'{"status": "SERVING"}'

        install(b, live)
        wait_until_served(grpc_port, "h2", leaf_der(b))
        wait_until_served(http_port, "http/1.1", leaf_der(b))
        assert "TLS certificate reloaded from" in proc.log_tail(50)
        # the connections made before the change go on
        assert health(channel) == SERVING
        https.request("GET", "/ready")
        assert https.getresponse().status == 200
        https.close()
        channel.close()
        # a new client that trusts only B's CA verifies both ports
        creds_b = grpc.ssl_channel_credentials(root_certificates=b.ca_pem)
        with grpc.secure_channel(f"127.0.0.1:{grpc_port}", creds_b) as fresh:
            assert health(fresh) == SERVING
        trusting_b = ssl.create_default_context(cadata=b.ca_pem.decode())
        https = http.client.HTTPSConnection("127.0.0.1", http_port, context=trusting_b)
        https.request("GET", "/ready")
        assert https.getresponse().status == 200
        https.close()

        # a bad pair: B's certificate with A's key; then a file that is not PEM
        shutil.copyfile(a.key_file, live / "tls.key")
        wait_for_log(proc, "does not match the certificate")
        (live / "tls.crt").write_bytes(b"not a certificate\n")
        wait_for_log(proc, "no PEM certificate in it")
        assert served_der(grpc_port, "h2") == leaf_der(b)
        assert served_der(http_port, "http/1.1") == leaf_der(b)
        assert proc.alive()
    finally:
        proc.stop()


def wait_for_log(proc: ManagedProcess, text: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while text not in proc.log_tail(50):
        assert time.monotonic() < deadline, f"no {text!r} in the log:\n{proc.log_tail(50)}"
        time.sleep(0.1)
    assert "TLS certificate not reloaded, still serving the previous one" in proc.log_tail(50)


def test_metrics_cert_dir_serves_the_http_port_alone_and_follows_its_files(
    tmp_path: Path, closed_addresses: list[str]
) -> None:
    """The llm-d Router's `--metrics-cert-dir`: a certificate of its own on the HTTP port
    (the gRPC port stays plaintext), reloaded like the others."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    live = tmp_path / "metrics-tls"
    live.mkdir()
    a, b = server_files(tmp_path / "a"), server_files(tmp_path / "b")
    install(a, live)
    proc = start_epp(
        tmp_path, "epp", "serve", "--grpc-port", "0", "--http-port", "0",
        "--grpc-health-port", "0", "--endpoint", closed_addresses[0], "--eject-after", "0",
        "--metrics-cert-dir", str(live), "--metrics-endpoint-auth",
        "--tls-reload-seconds", "0.2",
    )  # fmt: skip
    try:
        http_port = proc.info["http_port"]
        trusting_a = ssl.create_default_context(cadata=a.ca_pem.decode())
        https = http.client.HTTPSConnection("127.0.0.1", http_port, context=trusting_a)
        https.request("GET", "/ready")
        assert https.getresponse().status == 200
        https.close()
        with grpc.insecure_channel(f"127.0.0.1:{proc.info['grpc_port']}") as channel:
            assert health(channel) == SERVING
        install(b, live)
        wait_until_served(http_port, "http/1.1", leaf_der(b))
        assert "(grpclib, plaintext)" in proc.log_tail(100)
        assert "HTTP (TLS: " in proc.log_tail(100)
    finally:
        proc.stop()
