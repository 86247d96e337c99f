"""The prefill/decode profile handler: pick the decode endpoint, ask a decider whether a
separate prefill pays off, and if so pick the prefill endpoint."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from epp.common.params import ConfigError, Params
from epp.errors import NoEndpointError
from epp.scheduling.base import CycleContext, ProfileRunner
from epp.scheduling.deciders import Decider, make_decider
from epp.types import EndpointState, SchedulingResult

DISAGGREGATED = "disaggregated"
DECODE_ONLY = "decode-only"
NO_PREFILL_ENDPOINT = "no-prefill-endpoint"
DECISIONS = (DISAGGREGATED, DECODE_ONLY, NO_PREFILL_ENDPOINT)
DEFAULT_PREFIX_PLUGIN = "prefix-cache-scorer"
# Only these generate from a prompt; anything else (embeddings, tokenize, ...) decodes.
GENERATION_PATHS = frozenset({"/v1/completions", "/v1/chat/completions"})


class PDProfileHandler:
    """Runs ``decodeProfile`` (its picks are the targets, fallbacks included), then, if
    the request generates (completions, chat) and the decider wants it,
    ``prefillProfile`` over the other endpoints (its picks after the first are the prefill
    leg's fallbacks). A request still decodes when no other endpoint can prefill."""

    def __init__(
        self, where: str, decode: str, prefill: str, decider: Decider, prefix_plugin: str | None
    ) -> None:
        self.where = where
        self.decode = decode
        self.prefill = prefill
        self.decider = decider
        self.prefix_plugin = prefix_plugin

    def bind(self, plugins: Mapping[str, Any], profiles: Sequence[str]) -> None:
        for key, name in (("decodeProfile", self.decode), ("prefillProfile", self.prefill)):
            if name not in profiles:
                raise ConfigError(
                    f"{self.where}.{key}: no scheduling profile named {name!r}; "
                    f"profiles: {list(profiles)}"
                )
        name = self.prefix_plugin or DEFAULT_PREFIX_PLUGIN
        plugin = plugins.get(name)
        if plugin is not None and not callable(getattr(plugin, "cached_fraction", None)):
            plugin = None
        if plugin is None and self.prefix_plugin is not None:
            raise ConfigError(
                f"{self.where}.prefixPlugin: {name!r} is not a configured prefix-cache-scorer"
            )
        # without one, the decider counts every prompt token as uncached
        self.decider.use_cache_estimate(plugin)

    def run(
        self,
        ctx: CycleContext,
        profiles: Sequence[ProfileRunner],
        candidates: Sequence[EndpointState],
    ) -> SchedulingResult:
        by_name = {p.name: p for p in profiles}
        decode = by_name[self.decode].run(ctx, candidates)  # raises when none can decode
        targets = tuple(s.endpoint for s in decode)
        if ctx.request.path not in GENERATION_PATHS or not self.decider.wants_prefill(
            ctx, decode[0]
        ):
            return SchedulingResult(targets, decision=DECODE_ONLY)
        chosen = decode[0].address
        others = [s for s in candidates if s.address != chosen]
        try:
            prefill = by_name[self.prefill].run(ctx, others) if others else []
        except NoEndpointError:  # no prefill server up: the decode endpoint prefills itself
            prefill = []
        if not prefill:
            return SchedulingResult(targets, decision=NO_PREFILL_ENDPOINT)
        return SchedulingResult(
            targets,
            prefill=prefill[0].endpoint,
            decision=DISAGGREGATED,
            prefill_fallbacks=tuple(s.endpoint for s in prefill[1:]),
        )

    def run_decode(
        self,
        ctx: CycleContext,
        profiles: Sequence[ProfileRunner],
        candidates: Sequence[EndpointState],
    ) -> list[EndpointState]:
        """``decodeProfile`` alone: deferred decode selection, after the prefill leg."""
        return next(p for p in profiles if p.name == self.decode).run(ctx, candidates)


def pd_profile_handler(p: Params) -> PDProfileHandler:
    prefix = p.string("prefixPlugin", "")  # "" = the one named prefix-cache-scorer, if any
    return PDProfileHandler(
        p.where,
        decode=p.string("decodeProfile", "decode"),
        prefill=p.string("prefillProfile", "prefill"),
        decider=make_decider(p),
        prefix_plugin=prefix or None,
    )
