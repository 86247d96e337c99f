"""`epp serve` with TLS on the gRPC port, each transport, a self-signed certificate or
files from a test CA: a verifying gRPC client gets health and an ext_proc exchange over
TLS, a plaintext client gets nowhere. (Bad TLS flags and files:
tests/integration/epp/test_serve.py.)"""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import orjson
import pytest
from envoy.service.ext_proc.v3.external_processor_pb2_grpc import ExternalProcessorStub
from grpc_health.v1 import health_pb2, health_pb2_grpc

from epp_harness.procs import ManagedProcess, start_epp
from tests.support import extproc as m
from tests.support.certs import server_files
from tests.support.http import request
from tests.support.transports import transports

BODY = orjson.dumps({"model": "m", "prompt": "a prompt over TLS " * 10})
SERVING = health_pb2.HealthCheckResponse.SERVING


@dataclass
class TlsServer:
    proc: ManagedProcess
    trusted_pem: bytes  # the CA, or for self-signed the server's own certificate
    endpoint: str  # the one (closed) model-server address it routes to

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.proc.info['grpc_port']}"

    def secure_channel(self) -> grpc.Channel:
        creds = grpc.ssl_channel_credentials(root_certificates=self.trusted_pem)
        return grpc.secure_channel(self.address, creds)


def start(tmp_path: Path, endpoint: str, transport: str, *tls_flags: str) -> ManagedProcess:
    return start_epp(
        tmp_path, "epp", "serve", "--grpc-port", "0", "--http-port", "0", "--grpc-health-port", "0",
        "--endpoint", endpoint, "--eject-after", "0", "--transport", transport,
        *tls_flags,
    )  # fmt: skip


@pytest.fixture(
    params=[(t, mode) for t in transports() for mode in ("self-signed", "files")],
    ids=lambda p: "-".join(p),
)
def tls_server(
    tmp_path: Path, request: pytest.FixtureRequest, closed_addresses: list[str]
) -> Iterator[TlsServer]:
    endpoint = closed_addresses[0]
    transport, mode = request.param
    if mode == "files":
        files = server_files(tmp_path, rsa_bits=2048 if transport == "grpcio" else None)
        flags = ["--tls-cert-file", str(files.cert_file), "--tls-key-file", str(files.key_file)]
        proc = start(tmp_path, endpoint, transport, *flags)
        trusted = files.ca_pem
    else:
        proc = start(tmp_path, endpoint, transport, "--tls-self-signed")
        port = proc.info["grpc_port"]
        trusted = ssl.get_server_certificate(("127.0.0.1", port), timeout=5).encode()
    try:
        yield TlsServer(proc, trusted, endpoint)
    finally:
        proc.stop()


def test_health_and_ext_proc_over_tls(tls_server: TlsServer) -> None:
    with tls_server.secure_channel() as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "liveness", "readiness"):
            reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert reply.status == SERVING
        stub = ExternalProcessorStub(channel)
        replies = list(stub.Process(iter([m.request_headers(), *m.chunked(BODY, 7)]), timeout=10))
    assert m.set_headers(replies[0])["x-gateway-destination-endpoint"] == tls_server.endpoint
    assert m.streamed_body(replies[1:]) == (BODY, True)
    assert "TLS: " in tls_server.proc.log_tail(100)
    # the HTTP port stays plaintext; /ready is what kubelet probes instead of gRPC health
    http = f"http://127.0.0.1:{tls_server.proc.info['http_port']}"
    status, _, body = request(f"{http}/ready")
    assert (status, orjson.loads(body)) == (200, {"status": "SERVING"})


def test_plaintext_client_is_refused(tls_server: TlsServer) -> None:
    with grpc.insecure_channel(tls_server.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            health.Check(health_pb2.HealthCheckRequest(), timeout=3)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE  # refused, not left hanging


def test_default_stays_plaintext(tmp_path: Path, closed_addresses: list[str]) -> None:
    proc = start(tmp_path, closed_addresses[0], "grpclib")
    try:
        address = f"127.0.0.1:{proc.info['grpc_port']}"
        with grpc.insecure_channel(address) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=5
            )
        assert reply.status == SERVING
    finally:
        proc.stop()
    assert "(grpclib, plaintext)" in (tmp_path / "epp.log").read_text()
