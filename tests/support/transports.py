"""Which gRPC transports the tests run on.

Tests parametrized over the transports take :func:`transports`: every transport but
the opt-in ones (``native``, new: its own tests cover it in `make test`, plus the e2e
module that asks for every transport), unless ``EPP_TEST_TRANSPORTS=all``.
``EPP_E2E_TRANSPORT`` makes the e2e stacks that choose no transport run on the one it
names. `make test-transports` sets both (docs/testing.md)."""

from __future__ import annotations

import os

from epp.extproc.transport import TRANSPORTS

# run on these only when asked (EPP_TEST_TRANSPORTS=all) or where a test names them
OPT_IN = frozenset({"native"})


def transports(every: bool = False) -> list[str]:
    """The transports to parametrize over: all of them when ``every`` (the test is
    among those `make test` runs on each) or when EPP_TEST_TRANSPORTS=all."""
    if every or os.environ.get("EPP_TEST_TRANSPORTS") == "all":
        return sorted(TRANSPORTS)
    return sorted(set(TRANSPORTS) - OPT_IN)


def e2e_transport_args(epp_args: list[str]) -> list[str]:
    """``epp_args`` with ``--transport $EPP_E2E_TRANSPORT`` added when that is set and
    the args choose none."""
    chosen = os.environ.get("EPP_E2E_TRANSPORT")
    if not chosen or "--transport" in epp_args:
        return epp_args
    if chosen not in TRANSPORTS:
        raise ValueError(f"EPP_E2E_TRANSPORT={chosen!r}: not one of {sorted(TRANSPORTS)}")
    return [*epp_args, "--transport", chosen]
