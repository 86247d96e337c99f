from __future__ import annotations

from collections.abc import Iterator

import pytest

from epp.extproc.transport import TRANSPORTS
from epp_harness.stack import LocalStack, StackOptions

MAX_BODY = 2 * 1024 * 1024


def ephemeral(**kw: object) -> StackOptions:
    """A stack on ephemeral ports (so tests can run beside `make run` and each other)."""
    base: dict[str, object] = {
        "envoy_port": 0,
        "envoy_admin_port": 0,
        "grpc_port": 0,
        "http_port": 0,
        "log_level": "warning",
    }
    base.update(kw)
    return StackOptions(**base)  # type: ignore[arg-type]


@pytest.fixture(scope="module", params=sorted(TRANSPORTS))
def stack(request: pytest.FixtureRequest) -> Iterator[LocalStack]:
    """Envoy + EPP (each gRPC transport) + 4 simulators; the simulators are slowed just
    enough that concurrent requests overlap."""
    opts = ephemeral(
        servers=4,
        sim_args=["--time-scale", "0.2"],
        epp_args=["--max-body-bytes", str(MAX_BODY), "--transport", request.param],
    )
    with LocalStack(opts) as s:
        yield s
