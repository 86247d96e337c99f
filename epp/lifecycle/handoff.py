"""The prefill hand-off: what goes to the decode endpoint (from the P/D coordinator
when the request is disaggregated)."""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from dataclasses import replace
from functools import partial
from typing import Any

from epp.disagg.bodies import without_pd_fields
from epp.disagg.coordinators import Coordinator, DecodeLeg, Handoff
from epp.errors import ClientVisibleError
from epp.lifecycle.bus import Hooks
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
        hooks = self.picking.hooks
        if hooks.add_headers:  # the prefill leg's request carries them (epp.disagg.legs)
            added = hooks.headers_for(routed, prefill)
            if added:
                request = replace(request, headers={**request.headers, **added})
        deferred = routed.deferred is not None
        handoff = Handoff(
            request,
            doc if clean is None else clean,
            prefill,
            None if deferred else routed.result.primary,
            routed.result.prefill_fallbacks,
            partial(self.picking.pick_decode, routed, request) if deferred else None,
        )
        leg = self.coordinator.hand_off(handoff)
        if not hooks.prefill_done:
            return leg
        if isinstance(leg, DecodeLeg):  # no leg ran here (a sidecar runs it)
            for hook in hooks.prefill_done:
                hook(routed, None, None)
            return leg
        return _told(leg, routed, hooks)


async def _told(leg: Awaitable[DecodeLeg], routed: Routed, hooks: Hooks) -> DecodeLeg:
    """``leg``, whose end the ``prefill_done`` hooks are told: the decode endpoint when
    it succeeded (after a deferred pick: the one picked), else the client's error."""
    try:
        decode = await leg
    except ClientVisibleError as error:
        for hook in hooks.prefill_done:
            hook(routed, error.message, None)
        raise
    for hook in hooks.prefill_done:
        hook(routed, None, routed.result.primary)
    return decode
