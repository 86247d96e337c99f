"""Precise prefix-cache affinity: prefer the endpoint that holds the longest prefix of
this prompt's blocks, as the endpoints themselves reported them (vLLM's KV events,
:mod:`epp.kvevents`), with the prompt tokenized as the engine does
(:mod:`epp.common.tokenization`).

Endpoints whose events are not trusted (none received, or some lost and not yet
rebuilt) and requests whose tokens are unknown (no tokenizer configured, or a request
the tokenizer cannot reproduce) are scored by the approximate prefix-cache scorer
instead. docs/kv-events.md describes the whole.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from epp.common.params import ConfigError, Params
from epp.common.tokenization import HfTokenizer, PromptTokenizer, TokenizerError, prompt_token_ids
from epp.kvevents.index import Held, PreciseIndex, chain_keys, token_bytes
from epp.kvevents.settings import DEFAULT_PORT, KvEventsSettings
from epp.scheduling.base import CycleContext
from epp.scheduling.columns import FloatArray
from epp.scheduling.loadbound import LoadBound
from epp.scheduling.plugins.prefix import PrefixCacheScorer, prefix_cache_scorer
from epp.types import EndpointState, InferenceRequest, SchedulingResult, Snapshot

DEFAULT_FALLBACK = "prefix-cache-scorer"
# Prompts kept tokenized across cycles: flow control may schedule one request several
# times (its preferred endpoint, then the best with room; again after each hold), and
# tokenizing a long prompt costs milliseconds of the event loop each time.
PROMPT_MEMO = 256


@dataclass(frozen=True, slots=True)
class _Prompt:
    tokens: bytes  # packed (epp.kvevents.index.token_bytes)
    count: int
    lora: str


class PrecisePrefixCacheScorer:
    """Score = blocks of the prompt the endpoint holds / the prompt's full blocks, a
    block held only off the GPU (offloaded to CPU memory) counting ``cpuWeight``.

    Parameters: ``tokenizer`` (a directory with the model's ``tokenizer.json`` and
    ``tokenizer_config.json``; without it only prompts given as token ids match),
    ``kvEvents`` (``port`` 5557 on each endpoint's host, 0 = only endpoints whose label
    names one; ``topic`` ""; ``replayPort`` 0 = none), ``maxPrefixBlocksToMatch``
    (512), ``cpuWeight`` (0.5), ``maxBlocksPerEndpoint`` (100,000), ``rebuildSeconds``
    (60: how long an endpoint whose events were lost is scored approximately),
    the load bound (``loadBound`` 1.25 and the rest of :class:`LoadBound`'s parameters,
    as the approximate scorer's), ``fallbackPlugin`` (the
    prefix-cache-scorer to ask for endpoints without events; default the one named
    ``prefix-cache-scorer``, else one of its own with default parameters).
    """

    def __init__(
        self,
        where: str,
        *,
        index: PreciseIndex,
        tokenizer: PromptTokenizer | None,
        events: KvEventsSettings,
        max_blocks: int = 512,
        cpu_weight: float = 0.5,
        load_bound: LoadBound | None = None,
        fallback_plugin: str | None = None,
    ) -> None:
        self.where = where
        self.index = index
        self.tokenizer = tokenizer
        self.events = events
        self.max_blocks = max_blocks
        self.cpu_weight = cpu_weight
        self.load_bound = load_bound or LoadBound()
        self.fallback_plugin = fallback_plugin
        self.fallback: PrefixCacheScorer | None = None
        self._own_fallback = False
        self._key = f"precise/{id(self)}"
        self._prompts = PromptMemo(PROMPT_MEMO)

    def bind(self, plugins: Mapping[str, Any], profiles: Sequence[str]) -> None:
        name = self.fallback_plugin or DEFAULT_FALLBACK
        plugin = plugins.get(name)
        if isinstance(plugin, PrefixCacheScorer):
            self.fallback, self._own_fallback = plugin, False
        elif self.fallback_plugin is not None:
            raise ConfigError(
                f"{self.where}.fallbackPlugin: {name!r} is not a configured prefix-cache-scorer"
            )
        elif not self._own_fallback:  # none declared: one of our own, fed by on_routed
            self.fallback = prefix_cache_scorer(Params(f"{self.where} (fallback)", {}))
            self._own_fallback = True

    def on_routed(
        self, request: InferenceRequest, result: SchedulingResult, snapshot: Snapshot
    ) -> None:
        if self._own_fallback and self.fallback is not None:
            self.fallback.on_routed(request, result, snapshot)
        self.load_bound.routed(request)

    # -- per cycle (each computed once and shared by every profile) -------------------
    def prompt(self, ctx: CycleContext) -> _Prompt | None:
        """The request's tokens, or None when they cannot be known exactly."""
        key = self._key + "/prompt"
        if key not in ctx.cache:
            r = ctx.request
            lora = r.model if r.model in self.index.lora_names else ""
            ctx.cache[key] = self._prompts.get(r.body, r.path, lora, self._tokenize)
        found: _Prompt | None = ctx.cache[key]
        return found

    def _tokenize(self, path: str, body: Mapping[str, Any] | None, lora: str) -> _Prompt | None:
        ids = prompt_token_ids(path, body, self.tokenizer)
        return None if ids is None else _Prompt(token_bytes(ids), len(ids), lora)

    def trusted(self, ctx: CycleContext) -> frozenset[str]:
        """The endpoints scored precisely this cycle: those whose events are trusted,
        provided the prompt's tokens are known (it is tokenized only if there are any)."""
        key = self._key + "/trusted"
        found: frozenset[str] | None = ctx.cache.get(key)
        if found is None:
            found = self.index.trusted(ctx.now)
            if found and self.prompt(ctx) is None:
                found = frozenset()
            ctx.cache[key] = found
        return found

    def held(self, ctx: CycleContext) -> list[tuple[int, dict[str, Held]]]:
        """Per block size endpoints announce (usually one): address -> (GPU, any
        medium) leading blocks of the prompt it holds, trusted or not."""
        key = self._key + "/held"
        found: list[tuple[int, dict[str, Held]]] | None = ctx.cache.get(key)
        if found is None:
            found = []
            prompt = self.prompt(ctx)
            if prompt is not None:
                index = self.index
                root = index.root(prompt.lora)
                for size in index.block_sizes():
                    keys = chain_keys(prompt.tokens, size, self.max_blocks, root)
                    found.append((size, index.match(keys)))
            ctx.cache[key] = found
        return found

    def blocks_held(self, ctx: CycleContext, trusted: Container[str]) -> dict[str, float]:
        """address -> share of the prompt's full blocks it holds (GPU blocks count 1,
        others ``cpuWeight``), for the ``trusted`` endpoints holding any."""
        prompt = self.prompt(ctx)
        shares: dict[str, float] = {}
        if prompt is None:
            return shares
        w = self.cpu_weight
        for size, held in self.held(ctx):
            full = min(prompt.count // size, self.max_blocks)
            if full:
                shares.update(
                    {a: (g + w * (n - g)) / full for a, (g, n) in held.items() if a in trusted}
                )
        return shares

    def prompt_tokens(self, ctx: CycleContext) -> int:
        """The prompt's length in the engine's tokens when it was tokenized, else the
        estimate."""
        prompt = self.prompt(ctx) if self.trusted(ctx) else None
        return prompt.count if prompt is not None else ctx.request.prompt_tokens

    def cached_tokens(self, ctx: CycleContext) -> dict[str, int]:
        """address -> prompt tokens it probably caches: what trusted endpoints hold,
        else the approximate index's estimate (omitted where none): its share of the
        prompt, in the engine's tokens when the prompt was tokenized."""
        key = self._key + "/cached"
        found: dict[str, int] | None = ctx.cache.get(key)
        if found is None:
            trusted = self.trusted(ctx)
            found = {}
            if self.fallback is not None:
                fallback = self.fallback
                total = self.prompt_tokens(ctx)
                for address in fallback.matches(ctx):
                    if address not in trusted:
                        found[address] = round(fallback.cached_fraction(ctx, address) * total)
            w = self.cpu_weight
            for size, held in self.held(ctx) if trusted else ():
                for address, (gpu, anywhere) in held.items():
                    if address in trusted:
                        found[address] = round((gpu + w * (anywhere - gpu)) * size)
            ctx.cache[key] = found
        return found

    def cached_fraction(self, ctx: CycleContext, address: str) -> float:
        """Share of the prompt ``address`` probably caches (the P/D decider asks)."""
        total = self.prompt_tokens(ctx)
        return min(self.cached_tokens(ctx).get(address, 0) / total, 1.0) if total else 0.0

    def score(
        self, ctx: CycleContext, candidates: Sequence[EndpointState]
    ) -> list[float] | FloatArray:
        trusted = self.trusted(ctx)
        vectorize = ctx.vectorize(candidates)
        addresses = ctx.view(candidates).addresses if vectorize else [s.address for s in candidates]
        everyone = bool(trusted) and trusted.issuperset(addresses)
        base: Sequence[float] | FloatArray
        if everyone:
            base = []
        elif self.fallback is not None:
            base = self.fallback.score(ctx, candidates)
        else:
            base = [0.0] * len(candidates)
        if not trusted:
            return base if isinstance(base, np.ndarray) else list(base)
        precise = self.blocks_held(ctx, trusted)
        if vectorize:
            view = ctx.view(candidates)
            scores = view.by_address(precise)
            if not everyone:
                mask = np.fromiter(map(trusted.__contains__, addresses), np.bool_, len(addresses))
                scores = np.where(mask, scores, np.asarray(base, np.float64))
            self.load_bound.withhold_view(ctx, view, scores)
            return scores
        values = [
            precise.get(a, 0.0) if everyone or a in trusted else base[i]
            for i, a in enumerate(addresses)
        ]
        return self.load_bound.withhold(ctx, candidates, values)


class PromptMemo:
    """The last ``size`` requests' prompts, by the identity of their decoded body (one
    object for every copy flow control makes of a request), so a request rescheduled
    is not tokenized again. Holds the bodies it keys so an identity is never reused
    while remembered (pure: no I/O, ``tokenize`` does the work)."""

    def __init__(self, size: int) -> None:
        self.size = max(size, 1)
        self.misses = 0  # prompts tokenized
        self._found: OrderedDict[int, tuple[object, str, str, _Prompt | None]] = OrderedDict()

    def get(
        self,
        body: Mapping[str, Any] | None,
        path: str,
        lora: str,
        tokenize: Callable[[str, Mapping[str, Any] | None, str], _Prompt | None],
    ) -> _Prompt | None:
        if body is None:  # nothing to key by (and nothing to tokenize)
            return tokenize(path, body, lora)
        found = self._found.get(id(body))
        if found is not None and found[0] is body and found[1] == path and found[2] == lora:
            self._found.move_to_end(id(body))
            return found[3]
        self.misses += 1
        prompt = tokenize(path, body, lora)
        self._found[id(body)] = (body, path, lora, prompt)
        self._found.move_to_end(id(body))
        while len(self._found) > self.size:
            self._found.popitem(last=False)
        return prompt


def precise_prefix_cache_scorer(p: Params) -> PrecisePrefixCacheScorer:
    directory = p.get("tokenizer")
    tokenizer: PromptTokenizer | None = None
    if directory is not None:
        if not isinstance(directory, str) or not directory:
            raise ConfigError(f"{p.where}.tokenizer: a directory with tokenizer.json")
        try:
            tokenizer = HfTokenizer(Path(directory))
        except TokenizerError as exc:
            raise ConfigError(f"{p.where}.tokenizer: {exc}") from None
    cpu_weight = p.number("cpuWeight", 0.5, minimum=0.0)
    if cpu_weight > 1:
        raise ConfigError(f"{p.where}.cpuWeight: must be <= 1 (a GPU block counts 1)")
    fallback = p.get("fallbackPlugin")
    if fallback is not None and (not isinstance(fallback, str) or not fallback):
        raise ConfigError(f"{p.where}.fallbackPlugin: the name of a prefix-cache-scorer plugin")
    return PrecisePrefixCacheScorer(
        p.where,
        index=PreciseIndex(
            max_blocks_per_endpoint=p.integer("maxBlocksPerEndpoint", 100_000, minimum=1),
            rebuild_s=p.number("rebuildSeconds", 60.0, minimum=0.0),
        ),
        tokenizer=tokenizer,
        events=_events(Params(f"{p.where}.kvEvents", p.get("kvEvents"))),
        max_blocks=p.integer("maxPrefixBlocksToMatch", 512, minimum=1),
        cpu_weight=cpu_weight,
        load_bound=LoadBound.from_params(p),
        fallback_plugin=fallback,
    )


def _events(p: Params) -> KvEventsSettings:
    ports: dict[str, int | None] = {}
    for key, default in (("port", DEFAULT_PORT), ("replayPort", 0)):
        raw = p.integer(key, default, minimum=0)
        if raw > 65535:
            raise ConfigError(f"{p.where}.{key}: a port 1-65535 (0 = none), got {raw}")
        ports[key] = raw or None
    topic = p.get("topic")
    if topic is None:
        topic = ""
    if not isinstance(topic, str):
        raise ConfigError(f"{p.where}.topic: a string (the subscription prefix), got {topic!r}")
    p.done()
    return KvEventsSettings(port=ports["port"], topic=topic, replay_port=ports["replayPort"])
