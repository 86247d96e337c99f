"""``epp serve`` flags for TLS on the gRPC port. Kept apart from :mod:`epp.extproc.tls`
so that a plaintext start never imports ``cryptography``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

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


def check_flags(args: argparse.Namespace) -> None:
    """ValueError (a usage error) if the TLS flags do not go together."""
    cert, key = args.tls_cert_file, args.tls_key_file
    if (cert is None) != (key is None):
        raise ValueError("--tls-cert-file and --tls-key-file go together: give both or neither")
    if args.tls_self_signed and cert is not None:
        raise ValueError("--tls-self-signed and --tls-cert-file/--tls-key-file exclude each other")


def from_args(args: argparse.Namespace) -> ServerTls | None:
    """What the (checked) flags ask for: None for plaintext. Reads the files; raises
    TlsError naming the file that cannot be read or used."""
    if not args.tls_self_signed and args.tls_cert_file is None:
        return None
    from epp.extproc import tls

    if args.tls_self_signed:
        return tls.self_signed()
    return tls.load_files(args.tls_cert_file, args.tls_key_file)
