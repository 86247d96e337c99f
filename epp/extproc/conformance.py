"""The Gateway API Inference Extension conformance suite's response hook: the endpoint
that served a request, echoed to the client in ``x-conformance-test-served-endpoint``
(off by default; ``configs/conformance.yaml`` turns it on). Its request hook, the
endpoint selection header, is a scheduling filter (epp.scheduling.plugins.selection)."""

from __future__ import annotations

from dataclasses import dataclass

from epp.common.sections import setting

SERVED_ECHO_HEADER = "x-conformance-test-served-endpoint"


@dataclass(frozen=True)
class ConformanceConfig:
    """Hooks for the Gateway API Inference Extension conformance suite (tests only)."""

    echo_served_endpoint: bool = setting(
        False,
        "echoServedEndpoint",
        "answer each response with x-conformance-test-served-endpoint: the ip:port that "
        "served it (the proxy's envoy.lb x-gateway-destination-endpoint-served metadata, "
        "else its upstream.address attribute; left out when it reports neither)",
    )
