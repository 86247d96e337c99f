"""Before admission: the request's model resolved (rewrites, the adapter catalogue)
and, for a LoRA adapter, its candidates narrowed to the servers that hold it."""

from __future__ import annotations

import random
from collections.abc import Awaitable, Mapping
from dataclasses import replace
from typing import Any

from epp.lifecycle.picking import within
from epp.lora.placement import AdapterPlacement
from epp.modelnames import ModelsConfig, Resolved, resolve
from epp.types import InferenceRequest


class ModelResolver:
    """``models`` (replaced on a config reload): rewrites and the adapter catalogue;
    ``placement``: loads adapters where none is (None: placement off)."""

    def __init__(
        self,
        models: ModelsConfig | None = None,
        placement: AdapterPlacement | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.models = models or ModelsConfig()
        self.placement = placement
        self.rng = rng or random.Random()

    def resolve(self, request: InferenceRequest, doc: Mapping[str, Any] | None) -> Resolved:
        """The request's model rewritten and checked against the adapter catalogue
        (epp.modelnames); ModelNotFoundError for a model nobody serves."""
        return resolve(self.models, request, doc, self.rng)

    def place(self, request: InferenceRequest) -> InferenceRequest | Awaitable[InferenceRequest]:
        """A request for an adapter (catalogued, or listed by some server) narrowed to
        the servers that hold it; with placement on, after a load when none does (then
        awaitable). Any other request (a base model; an adapter nobody holds, which the
        servers answer 404) as it came."""
        placement, model = self.placement, request.model
        if placement is None or model is None:
            return request
        if not (request.lora_adapter or placement.lists(model)):
            return request
        holders = placement.holders(model)
        if holders:
            return within(replace(request, lora_adapter=True), holders)
        if request.lora_adapter and placement.cfg.enabled:
            return self._place_after_load(placement, request, model)
        return request

    async def _place_after_load(
        self, placement: AdapterPlacement, request: InferenceRequest, adapter: str
    ) -> InferenceRequest:
        return within(request, await placement.ensure(adapter))
