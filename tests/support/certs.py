"""Throwaway PKI for TLS tests: a CA and a server certificate it signs, as PEM files."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric.types import CertificateIssuerPrivateKeyTypes
from cryptography.x509.oid import NameOID


@dataclass(frozen=True)
class ServerFiles:
    ca_pem: bytes  # what a verifying client trusts
    cert_file: Path  # server certificate, then the CA (a chain)
    key_file: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _builder(subject: str, issuer: str, public_key: object) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(_name(issuer))
        .public_key(public_key)  # type: ignore[arg-type]
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=2))
    )


def _pem_key(key: CertificateIssuerPrivateKeyTypes) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )


def server_files(directory: Path, rsa_bits: int | None = None) -> ServerFiles:
    """A test CA and a server certificate for localhost / 127.0.0.1 signed by it; its
    key is P-256, or RSA of ``rsa_bits``."""
    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca = (
        _builder("epp test CA", "epp test CA", ca_key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key: CertificateIssuerPrivateKeyTypes
    if rsa_bits:
        key = rsa.generate_private_key(65537, rsa_bits)
    else:
        key = ec.generate_private_key(ec.SECP256R1())
    names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    leaf = (
        _builder("epp test server", "epp test CA", key.public_key())
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    ca_pem = ca.public_bytes(serialization.Encoding.PEM)
    cert_file, key_file = directory / "server.crt", directory / "server.key"
    cert_file.write_bytes(leaf.public_bytes(serialization.Encoding.PEM) + ca_pem)
    key_file.write_bytes(_pem_key(key))
    return ServerFiles(ca_pem, cert_file, key_file)
