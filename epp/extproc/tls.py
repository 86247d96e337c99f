"""TLS for the gRPC port (ext_proc, EDS, gRPC health) and the HTTP port: the
certificate and key served, read from PEM files or generated self-signed at start-up
(:mod:`epp.extproc.certreload` follows the files afterwards).

Gateways that follow the Gateway API Inference Extension connect to their endpoint
picker over TLS by default and do not verify its certificate, which is why a
self-signed certificate is enough for them.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from epp.errors import InternalError

SELF_SIGNED_DAYS = 365
SELF_SIGNED_NAMES = ("localhost", "127.0.0.1", "::1")
# What the certificate's subject says when generated (nothing verifies it).
SELF_SIGNED_CN = "epp"


class TlsError(InternalError, ValueError):
    """Unusable certificate or key; the message names the file."""


@dataclass(frozen=True, slots=True)
class ServerTls:
    """A PEM certificate chain (leaf first) and its private key."""

    cert_pem: bytes
    key_pem: bytes = field(repr=False)  # never in a log line or a traceback
    source: str  # for the start-up log: the files, or "self-signed"
    files: tuple[Path, Path] | None = None  # (certificate, key) it was read from


def load_files(cert_file: Path, key_file: Path) -> ServerTls:
    texts = []
    for what, path in (("certificate", cert_file), ("key", key_file)):
        try:
            texts.append(path.read_bytes())
        except OSError as exc:
            raise TlsError(f"TLS {what} file {path}: {exc.strerror or exc}") from None
    tls = parse(texts[0], texts[1], str(cert_file), str(key_file))
    return ServerTls(tls.cert_pem, tls.key_pem, tls.source, (cert_file, key_file))


def parse(cert_pem: bytes, key_pem: bytes, cert_name: str, key_name: str) -> ServerTls:
    """Check that the PEM texts hold a certificate chain and the leaf's private key."""
    try:
        chain = x509.load_pem_x509_certificates(cert_pem)
    except ValueError:
        raise TlsError(f"TLS certificate file {cert_name}: no PEM certificate in it") from None
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except TypeError:
        raise TlsError(f"TLS key file {key_name}: encrypted keys are not supported") from None
    except (ValueError, UnsupportedAlgorithm):
        raise TlsError(f"TLS key file {key_name}: no usable PEM private key in it") from None
    if _public_der(chain[0].public_key()) != _public_der(key.public_key()):
        raise TlsError(f"TLS key file {key_name} does not match the certificate in {cert_name}")
    tls = ServerTls(cert_pem, key_pem, f"{cert_name}, {key_name}")
    try:  # OpenSSL's own policy (e.g. key sizes), checked now for both transports
        server_context(tls)
    except ssl.SSLError as exc:
        raise TlsError(
            f"TLS certificate file {cert_name} with key file {key_name}: OpenSSL refuses "
            f"them: {exc.reason or exc}"
        ) from None
    return tls


def _public_der(public_key: object) -> bytes:
    der: bytes = public_key.public_bytes(  # type: ignore[attr-defined]
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return der


def self_signed(
    names: tuple[str, ...] = SELF_SIGNED_NAMES, now: datetime.datetime | None = None
) -> ServerTls:
    """A fresh P-256 key and a certificate for ``names`` (DNS names or IP literals)
    signed by itself, valid from now for SELF_SIGNED_DAYS."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, SELF_SIGNED_CN)])
    start = now or datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start - datetime.timedelta(minutes=5))  # tolerate clock skew
        .not_valid_after(start + datetime.timedelta(days=SELF_SIGNED_DAYS))
        .add_extension(x509.SubjectAlternativeName([_general_name(n) for n in names]), False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return ServerTls(cert.public_bytes(serialization.Encoding.PEM), key_pem, "self-signed")


def _general_name(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


GRPC_ALPN = ("h2",)  # gRPC runs over HTTP/2
HTTP_ALPN = ("http/1.1",)  # the HTTP port (aiohttp speaks HTTP/1.1)


def server_context(tls: ServerTls, alpn: tuple[str, ...] = GRPC_ALPN) -> ssl.SSLContext:
    """An asyncio server context: TLS 1.2+, the given ALPN protocols."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(list(alpn))
    load_into(context, tls)
    return context


def load_into(context: ssl.SSLContext, tls: ServerTls) -> None:
    """Make ``context`` serve ``tls``: handshakes from now on get it, connections
    already open keep the certificate they were made with."""
    with _pem_paths(tls) as (cert, key):
        context.load_cert_chain(cert, key)


@contextmanager
def _pem_paths(tls: ServerTls) -> Iterator[tuple[str, str]]:
    """Paths to the PEM texts for the ssl module, which loads keys from files only:
    anonymous in-memory files on Linux (nothing on disk; works on a read-only root
    filesystem), else a private temp dir removed on exit."""
    if hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd"):
        fds = [os.memfd_create(name) for name in ("epp-tls-cert", "epp-tls-key")]
        try:
            for fd, data in zip(fds, (tls.cert_pem, tls.key_pem), strict=True):
                with os.fdopen(fd, "wb", closefd=False) as f:
                    f.write(data)
            yield f"/proc/self/fd/{fds[0]}", f"/proc/self/fd/{fds[1]}"
        finally:
            for fd in fds:
                os.close(fd)
        return
    with tempfile.TemporaryDirectory(prefix="epp-tls-") as tmp:  # mode 0700
        cert, key = Path(tmp) / "cert.pem", Path(tmp) / "key.pem"
        cert.write_bytes(tls.cert_pem)
        key.touch(mode=0o600)
        key.write_bytes(tls.key_pem)
        yield str(cert), str(key)
