"""Shared fixtures: real processes on loopback, ephemeral ports, ready files."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from epp.procs import ManagedProcess, start_epp


@pytest.fixture(params=["grpcio", "grpclib"])
def epp_server(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[ManagedProcess]:
    """A real ``epp serve`` (each gRPC transport) on ephemeral ports routing to two
    (unused) addresses; failure ejection is off, so the dead addresses stay routable."""
    proc = start_epp(
        tmp_path,
        "epp",
        "serve",
        "--grpc-port",
        "0",
        "--http-port",
        "0",
        "--endpoint",
        "127.0.0.1:18001",
        "--endpoint",
        "127.0.0.1:18002",
        "--max-body-bytes",
        "4096",
        "--eject-after",
        "0",
        "--transport",
        request.param,
    )
    try:
        yield proc
    finally:
        proc.stop()
