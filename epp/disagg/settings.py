"""The ``disaggregation`` config section: how prefill and decode legs meet."""

from __future__ import annotations

from dataclasses import dataclass

from epp.common.sections import setting
from epp.disagg.coordinators import COORDINATORS


@dataclass(frozen=True)
class DisaggConfig:
    """How a disaggregated request's prefill and decode legs meet."""

    coordinator: str = setting(
        "nixl",
        "coordinator",
        "how the legs meet; `epp serve --coordinator` overrides it",
        choices=COORDINATORS.keys(),
    )
    # keep it below Envoy's ext_proc message_timeout (30 s in the shipped configs), or
    # Envoy fails the request before the EPP can decode alone
    prefill_timeout_s: float = setting(
        25.0,
        "prefillTimeoutSeconds",
        "the prefill leg, failover included (shared out equally among the request's "
        "prefill endpoints); past it the request decodes alone",
        minimum=0.001,
    )
    connect_timeout_s: float = setting(
        1.0,
        "connectTimeoutSeconds",
        "reaching a prefill server; past it the leg goes to the next prefill endpoint, "
        "or the request decodes alone",
        minimum=0.001,
    )
    defer_decode: bool = setting(
        False,
        "deferDecode",
        "pick the decode endpoint after the prefill leg, with that moment's load (nixl, "
        "kv-pool); false: together with the prefill endpoint",
    )
    bootstrap_port: int | None = setting(
        None,
        "bootstrapPort",
        "SGLang's bootstrap port on prefill servers; null: the prefill's own port",
        minimum=1,
        maximum=65535,
    )
