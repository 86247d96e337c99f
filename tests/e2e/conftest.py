from __future__ import annotations

from collections.abc import Iterator

import pytest

from epp_harness.stack import LocalStack, StackOptions
from tests.support.transports import e2e_transport_args, transports

MAX_BODY = 2 * 1024 * 1024


def ephemeral(**kw: object) -> StackOptions:
    """A stack on ephemeral ports (so tests can run beside `make run` and each other);
    on $EPP_E2E_TRANSPORT's transport when its EPP args choose none."""
    base: dict[str, object] = {
        "envoy_port": 0,
        "envoy_admin_port": 0,
        "grpc_port": 0,
        "http_port": 0,
        "log_level": "warning",
    }
    base.update(kw)
    given = kw.get("epp_args")
    base["epp_args"] = e2e_transport_args(list(given) if isinstance(given, list) else [])
    return StackOptions(**base)  # type: ignore[arg-type]


def transport_stack(transport: str) -> Iterator[LocalStack]:
    """Envoy + EPP (on ``transport``) + 4 simulators; the simulators are slowed just
    enough that concurrent requests overlap."""
    opts = ephemeral(
        servers=4,
        sim_args=["--time-scale", "0.2"],
        epp_args=["--max-body-bytes", str(MAX_BODY), "--transport", transport],
    )
    with LocalStack(opts) as s:
        yield s


@pytest.fixture(scope="module", params=transports())
def stack(request: pytest.FixtureRequest) -> Iterator[LocalStack]:
    """:func:`transport_stack` on each gRPC transport (tests/support/transports.py)."""
    yield from transport_stack(request.param)
