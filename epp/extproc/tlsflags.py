"""``epp serve`` flags for TLS on the gRPC port, ours and the llm-d Router's
(``--secure-serving``, ``--cert-path``). Kept apart from :mod:`epp.extproc.tls` so that
a plaintext start never imports ``cryptography``.

Whether the port is TLS, in one place (:func:`wants_tls`): certificate files or
``--tls-self-signed`` turn it on; ``--secure-serving[=true|false]`` says so explicitly;
without either, it is on when the EPP follows Kubernetes (``--pool-name``,
``--endpoint-selector``: gateways dial their endpoint picker over TLS without verifying
it, and the llm-d Router defaults to TLS) and off otherwise (``epp stack``, our Envoy
configs and static setups dial plaintext).

The HTTP port (``/metrics``, ``/status``, the admin API and its key) is plaintext unless
``--http-tls`` (the gRPC port's certificate) or ``--metrics-cert-dir`` (the llm-d
Router's flag: a certificate of its own) says otherwise; ``--secure-serving`` leaves it
alone, as it does in the llm-d Router. Certificate files are reloaded when they change
(:mod:`epp.extproc.certreload`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from epp.common.argtypes import go_bool, non_negative_float

if TYPE_CHECKING:
    from epp.extproc.tls import ServerTls


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tls-cert-file",
        type=Path,
        metavar="PATH",
        help="serve the gRPC port over TLS with this PEM certificate chain (leaf first); "
        "needs --tls-key-file",
    )
    parser.add_argument(
        "--tls-key-file",
        type=Path,
        metavar="PATH",
        help="the PEM private key of --tls-cert-file (unencrypted)",
    )
    parser.add_argument(
        "--tls-self-signed",
        action="store_true",
        help="serve the gRPC port over TLS with a certificate generated in memory at start "
        "(for gateways that skip verification); the HTTP port too with --http-tls",
    )
    parser.add_argument(
        "--secure-serving",
        type=go_bool,
        nargs="?",
        const=True,
        metavar="BOOL",
        help="llm-d Router flag: TLS on the gRPC port (true: the certificate files given, "
        "else self-signed; false: plaintext). Default: true with --pool-name or "
        "--endpoint-selector, else false (docs/llm-d-router.md)",
    )
    parser.add_argument(
        "--cert-path",
        type=Path,
        metavar="DIR",
        help="llm-d Router flag: a directory holding tls.crt and tls.key, as "
        "--tls-cert-file DIR/tls.crt --tls-key-file DIR/tls.key",
    )
    parser.add_argument(
        "--http-tls",
        type=go_bool,
        nargs="?",
        const=True,
        default=False,
        metavar="BOOL",
        help="serve the HTTP port over TLS too, with the gRPC port's certificate (which "
        "must be on TLS)",
    )
    parser.add_argument(
        "--metrics-cert-dir",
        type=Path,
        metavar="DIR",
        help="llm-d Router flag: serve the HTTP port over TLS with DIR/tls.crt and "
        "DIR/tls.key; as there, needs --metrics-endpoint-auth",
    )
    parser.add_argument(
        "--tls-reload-seconds",
        type=non_negative_float,
        default=2.0,
        metavar="SECONDS",
        help="how often to check the certificate files of both ports for changes; a "
        "changed pair is served from the next handshake on (0: never)",
    )


def check_flags(args: argparse.Namespace) -> None:
    """ValueError (a usage error) if the TLS flags do not go together."""
    cert, key = args.tls_cert_file, args.tls_key_file
    if (cert is None) != (key is None):
        raise ValueError("--tls-cert-file and --tls-key-file go together: give both or neither")
    if args.cert_path is not None and cert is not None:
        raise ValueError("--cert-path and --tls-cert-file/--tls-key-file exclude each other")
    files = cert is not None or args.cert_path is not None
    if args.tls_self_signed and files:
        raise ValueError(
            "--tls-self-signed and certificate files (--tls-cert-file, --cert-path) "
            "exclude each other"
        )
    if args.secure_serving is False and (files or args.tls_self_signed):
        raise ValueError("--secure-serving=false contradicts the TLS flags given with it")
    if args.http_tls and args.metrics_cert_dir is not None:
        raise ValueError("--http-tls and --metrics-cert-dir exclude each other")
    if args.http_tls and not wants_tls(args):
        raise ValueError(
            "--http-tls serves the gRPC port's certificate, but the gRPC port is plaintext "
            "(give certificate files, --tls-self-signed or --secure-serving)"
        )
    if args.metrics_cert_dir is not None and not args.metrics_endpoint_auth:
        raise ValueError(
            "--metrics-cert-dir enables TLS on the metrics port without authentication; "
            "add --metrics-endpoint-auth (as the llm-d Router requires)"
        )


def wants_tls(args: argparse.Namespace) -> bool:
    """Whether the (checked) flags put the gRPC port on TLS (see the module doc)."""
    if args.tls_self_signed or args.tls_cert_file is not None or args.cert_path is not None:
        return True
    if args.secure_serving is not None:
        return bool(args.secure_serving)
    return args.pool_name is not None or args.endpoint_selector is not None


def from_args(args: argparse.Namespace) -> ServerTls | None:
    """What the (checked) flags ask for: None for plaintext. Reads the files; raises
    TlsError naming the file that cannot be read or used."""
    if not wants_tls(args):
        return None
    from epp.extproc import tls

    if args.cert_path is not None:
        return tls.load_files(args.cert_path / "tls.crt", args.cert_path / "tls.key")
    if args.tls_cert_file is not None:
        return tls.load_files(args.tls_cert_file, args.tls_key_file)
    return tls.self_signed()


def http_from_args(args: argparse.Namespace, grpc_tls: ServerTls | None) -> ServerTls | None:
    """The HTTP port's certificate: ``grpc_tls`` itself with ``--http-tls``, the pair in
    ``--metrics-cert-dir``, else None (plaintext). Raises TlsError like :func:`from_args`."""
    if args.http_tls:
        return grpc_tls
    if args.metrics_cert_dir is None:
        return None
    from epp.extproc import tls

    return tls.load_files(args.metrics_cert_dir / "tls.crt", args.metrics_cert_dir / "tls.key")
