"""The prefill hand-off: what goes to the decode endpoint (from the P/D coordinator
when the request is disaggregated)."""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from functools import partial
from typing import Any

from epp.disagg.bodies import without_pd_fields
from epp.disagg.coordinators import Coordinator, DecodeLeg, Handoff
from epp.lifecycle.picking import Picking
from epp.lifecycle.record import Routed
from epp.types import InferenceRequest


class PrefillHandoff:
    """Carries out disaggregated requests with ``coordinator`` (None: they simply
    decode); a deferred decode pick goes back to ``picking``."""

    def __init__(self, coordinator: Coordinator | None, picking: Picking) -> None:
        self.coordinator = coordinator
        self.picking = picking

    def hand_off(
        self,
        routed: Routed,
        request: InferenceRequest,
        doc: Mapping[str, Any],
        rewritten: bool = False,
    ) -> DecodeLeg | Awaitable[DecodeLeg] | None:
        """The decode leg: from the coordinator when the request is disaggregated, else
        None (the body goes as sent), unless the client sent P/D fields of its own,
        which are dropped, or ``doc`` is a rewritten body (a new model name)."""
        clean = without_pd_fields(doc)
        if clean is None and rewritten:
            clean = dict(doc)
        prefill = routed.result.prefill
        if prefill is None or self.coordinator is None:
            return None if clean is None else DecodeLeg(doc=clean)
        deferred = routed.deferred is not None
        handoff = Handoff(
            request,
            doc if clean is None else clean,
            prefill,
            None if deferred else routed.result.primary,
            routed.result.prefill_fallbacks,
            partial(self.picking.pick_decode, routed, request) if deferred else None,
        )
        return self.coordinator.hand_off(handoff)
