"""Shared fixtures: real processes on loopback, ephemeral ports, ready files."""

from __future__ import annotations

import os

# Set before grpc loads. Tests start children with a preexec_fn (epp_harness.procs), so
# fork runs Python in the child before exec; grpc's fork handlers then restart its
# poller there, which aborted children ("epoll_wait error: Bad file descriptor") after
# in-process gRPC tests. No test forks a process that keeps using gRPC.
os.environ["GRPC_ENABLE_FORK_SUPPORT"] = "false"

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from epp_harness.procs import ManagedProcess, start_epp
from tests.support.transports import transports

# property tests check results, never speed: a shared machine stalls any test sometimes
settings.register_profile("epp", deadline=None)
settings.load_profile("epp")


@pytest.fixture
def closed_addresses() -> Iterator[list[str]]:
    """Two loopback ``ip:port`` with nothing listening: held bound (never listening) for
    the test, so no other process can take the ports meanwhile (a fixed port could be
    anyone's)."""
    with socket.socket() as one, socket.socket() as two:
        for sock in (one, two):
            sock.bind(("127.0.0.1", 0))
        yield [f"127.0.0.1:{sock.getsockname()[1]}" for sock in (one, two)]


@pytest.fixture(params=transports())
def epp_server(
    tmp_path: Path, request: pytest.FixtureRequest, closed_addresses: list[str]
) -> Iterator[ManagedProcess]:
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
        "--grpc-health-port",
        "0",
        "--endpoint",
        closed_addresses[0],
        "--endpoint",
        closed_addresses[1],
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
