"""The Gateway API Inference Extension conformance suite's endpoint selection: the
request header ``test-epp-endpoint-selection`` names the endpoints a request may go to.

The value is a comma-separated list of tokens, each a bare host (every port of that
pod: ``10.0.0.7``, ``::1``) or one endpoint (``10.0.0.7:3002``, ``[::1]:3002``).
Whitespace around a token is ignored. A token matches an endpoint when it equals the
endpoint's host or its ``host:port`` address exactly; a token that matches nothing
(malformed, an unknown pod, a port the pool does not serve) is ignored. When no token
matches, or the header is absent or empty, every candidate stays.

A test hook: the EPP strips the header before the request reaches the model server,
and ignores it unless this filter is in the config (``configs/conformance.yaml``).
"""

from __future__ import annotations

from collections.abc import Sequence

from epp.common.params import Params
from epp.scheduling.base import CycleContext
from epp.types import EndpointState

SELECTION_HEADER = "test-epp-endpoint-selection"


def selection_tokens(value: str) -> frozenset[str]:
    """The header value's tokens: split on commas, trimmed, empty ones dropped."""
    return frozenset(token for part in value.split(",") if (token := part.strip()))


class EndpointSelectionHeaderFilter:
    """Keeps the candidates the selection header names; all of them when it names none
    of them (see the module docstring)."""

    def filter(
        self, ctx: CycleContext, candidates: Sequence[EndpointState]
    ) -> Sequence[EndpointState]:
        value = ctx.request.headers.get(SELECTION_HEADER)
        if not value:
            return candidates
        tokens = selection_tokens(value)
        kept = [s for s in candidates if s.address in tokens or s.endpoint.host in tokens]
        return kept or candidates


def endpoint_selection_header_filter(p: Params) -> EndpointSelectionHeaderFilter:
    return EndpointSelectionHeaderFilter()
