"""``epp serve`` flags for elastic membership: the admin API key, the readiness wait,
failure ejection, draining and the state file.

Wiring beside :mod:`epp.serving.serve`: it gathers settings of the admin API, discovery and the
data layer, so it sits above all three."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

from epp.admin.auth import API_KEY_ENV, load_key
from epp.common import argtypes
from epp.datalayer.ejection import EjectionPolicy
from epp.datastore import DEFAULT_DRAIN_TIMEOUT_S
from epp.discovery.names import DEFAULT_RESOLVE_INTERVAL_S
from epp.discovery.runtime import WaitPolicy


@dataclass(frozen=True)
class MembershipOptions:
    admin_api_key: str | None = None
    model: str | None = None
    wait: WaitPolicy = field(default_factory=WaitPolicy)
    ejection: EjectionPolicy = field(default_factory=EjectionPolicy)
    drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S
    state_file: Path | None = None
    resolve_interval_s: float = DEFAULT_RESOLVE_INTERVAL_S


def options(args: argparse.Namespace) -> MembershipOptions:
    """The parsed flags; OSError/ValueError if the key file is unreadable or empty."""
    return MembershipOptions(
        admin_api_key=load_key(args.admin_api_key_file),
        model=args.model,
        wait=WaitPolicy(args.waiting_retry_interval, args.max_waiting_retries),
        ejection=EjectionPolicy(
            eject_after=args.eject_after,
            backoff_s=args.eject_backoff_seconds,
            max_backoff_s=max(args.max_eject_backoff_seconds, args.eject_backoff_seconds),
            remove_after_s=args.remove_after_seconds,
            keep_ejected=args.keep_ejected,
        ),
        drain_timeout_s=args.drain_timeout_seconds,
        state_file=args.state_file,
        resolve_interval_s=args.resolve_interval_seconds,
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group(
        "elastic membership", "see docs/operations.md, Scaling at runtime"
    )
    g.add_argument(
        "--admin-api-key-file",
        type=Path,
        metavar="FILE",
        help=f"key that /instances/add and /instances/remove require in X-Api-Key (else "
        f"${API_KEY_ENV}; with neither, those calls are refused)",
    )
    g.add_argument(
        "--model",
        help="model an added instance must list in /v1/models before it joins "
        "(without it, GET /health answering 200 is enough)",
    )
    g.add_argument(
        "--waiting-retry-interval",
        type=argtypes.non_negative_float,
        default=WaitPolicy.retry_interval_s,
        metavar="SECONDS",
        help="how often an added instance that is not ready yet is checked again",
    )
    g.add_argument(
        "--max-waiting-retries",
        type=argtypes.non_negative_int,
        default=WaitPolicy.max_retries,
        help="checks of a waiting instance before it is dropped",
    )
    g.add_argument(
        "--eject-after",
        type=argtypes.non_negative_int,
        default=EjectionPolicy.eject_after,
        help="consecutive failures (connect errors, 5xx, unreachable scrapes) that take an "
        "endpoint out of picking; any success resets the count (0 = never eject)",
    )
    g.add_argument(
        "--eject-backoff-seconds",
        type=argtypes.non_negative_float,
        default=EjectionPolicy.backoff_s,
        help="first ejection's length; each further one in a row doubles it",
    )
    g.add_argument(
        "--max-eject-backoff-seconds",
        type=argtypes.non_negative_float,
        default=EjectionPolicy.max_backoff_s,
        help="longest ejection",
    )
    g.add_argument(
        "--remove-after-seconds",
        type=argtypes.non_negative_float,
        default=EjectionPolicy.remove_after_s,
        help="an ejected endpoint still failing this long after its first ejection is "
        "removed from the pool (0 = never); it is re-checked until then",
    )
    g.add_argument(
        "--keep-ejected",
        action="store_true",
        help="never remove failing endpoints: keep them ejected and keep re-checking",
    )
    g.add_argument(
        "--drain-timeout-seconds",
        type=argtypes.non_negative_float,
        default=DEFAULT_DRAIN_TIMEOUT_S,
        help="a removed endpoint's in-flight requests are waited for this long",
    )
    g.add_argument(
        "--resolve-interval-seconds",
        type=argtypes.non_negative_float,
        default=DEFAULT_RESOLVE_INTERVAL_S,
        help="how often servers given by host name are looked up again; a changed "
        "address replaces the old one, which drains (0 = only at start)",
    )
    g.add_argument(
        "--state-file",
        type=Path,
        metavar="PATH",
        help="keep runtime-added instances here and re-add them on start",
    )
