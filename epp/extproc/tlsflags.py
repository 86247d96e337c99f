"""``epp serve`` flags for TLS on the gRPC port, ours and the llm-d Router's
(``--secure-serving``, ``--cert-path``). Kept apart from :mod:`epp.extproc.tls` so that
a plaintext start never imports ``cryptography``.

Whether the port is TLS, in one place (:func:`wants_tls`): certificate files or
``--tls-self-signed`` turn it on; ``--secure-serving[=true|false]`` says so explicitly;
without either, it is on when the EPP follows Kubernetes (``--pool-name``,
``--endpoint-selector``: gateways dial their endpoint picker over TLS without verifying
it, and the llm-d Router defaults to TLS) and off otherwise (``epp stack``, our Envoy
configs and static setups dial plaintext)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from epp.argtypes import go_bool

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
        "(for gateways that skip verification); the HTTP port stays plaintext",
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
