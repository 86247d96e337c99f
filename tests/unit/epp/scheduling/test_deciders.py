"""The P/D profile handler and its deciders on plain snapshots (default config)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from epp.config import build_scheduler, default_yaml
from epp.errors import NoEndpointError
from epp.scheduling.base import CycleContext
from epp.scheduling.deciders import BenefitDecider, PrefixBasedDecider
from epp.scheduling.latency import LatencyModel, LatencyPriors, interference_s
from epp.types import Endpoint, EndpointMetrics, EndpointState, InferenceRequest, Role, Snapshot

NOW = 50.0
LONG = "tell me about the sea. " * 200  # ~1,150 tokens
SHORT = "hi"


def pool(*roles: Role, waiting: float = 0.0) -> Snapshot:
    states = tuple(
        EndpointState(
            Endpoint("10.0.0.1", 8000 + i, role),
            EndpointMetrics(updated_at=NOW, waiting=waiting, running=0, kv_usage=0.1),
        )
        for i, role in enumerate(roles)
    )
    return Snapshot(states, {s.address: 0 for s in states})


def request(prompt: str) -> InferenceRequest:
    return InferenceRequest("r", "m", "/v1/completions", prompt=prompt)


def scheduler(text: str = ""):  # type: ignore[no-untyped-def]
    return build_scheduler(text, clock=lambda: NOW)  # empty: the built-in default


def test_long_prompt_is_disaggregated_onto_a_prefill_endpoint() -> None:
    snap = pool(Role.PREFILL, Role.PREFILL, Role.DECODE, Role.DECODE)
    result = scheduler().schedule(request(LONG), snap, random.Random(1))
    assert result.decision == "disaggregated"
    assert result.primary.role is Role.DECODE
    assert result.prefill is not None and result.prefill.role is Role.PREFILL
    # the prefill profile's other pick is the prefill leg's fallback
    [fallback] = result.prefill_fallbacks
    assert fallback.role is Role.PREFILL and fallback != result.prefill


def test_short_prompt_goes_decode_only() -> None:
    snap = pool(Role.PREFILL, Role.DECODE)
    result = scheduler().schedule(request(SHORT), snap, random.Random(1))
    assert (result.decision, result.prefill) == ("decode-only", None)
    assert result.primary.role is Role.DECODE


def test_prompt_cached_on_the_decode_endpoint_goes_decode_only() -> None:
    sched = scheduler()
    snap = pool(Role.PREFILL, Role.DECODE)
    first = sched.schedule(request(LONG), snap, random.Random(1))
    assert first.decision == "disaggregated"
    sched.on_routed(request(LONG), first, snap)  # the decode endpoint now holds the KV
    again = sched.schedule(request(LONG + " and the sky?"), snap, random.Random(1))
    assert again.decision == "decode-only"
    assert again.primary == first.primary


def test_no_prefill_server_means_decode_alone_not_an_error() -> None:
    result = scheduler().schedule(request(LONG), pool(Role.DECODE, Role.DECODE), random.Random(1))
    assert (result.decision, result.prefill) == ("no-prefill-endpoint", None)


def test_a_lone_prefill_decode_endpoint_does_both_itself() -> None:
    result = scheduler().schedule(request(LONG), pool(Role.BOTH), random.Random(1))
    assert (result.decision, result.prefill) == ("no-prefill-endpoint", None)


def test_no_decode_endpoint_is_503() -> None:
    with pytest.raises(NoEndpointError, match="after filter 'decode-filter'"):
        scheduler().schedule(request(LONG), pool(Role.PREFILL), random.Random(1))


@pytest.mark.parametrize(
    ("decider", "prompt", "expected"),
    [
        ("always", SHORT, "disaggregated"),
        ("never", LONG, "decode-only"),
        ("prefix-based", LONG, "disaggregated"),
    ],
)
def test_deciders_by_name(decider: str, prompt: str, expected: str) -> None:
    text = default_yaml()
    if decider != "prefix-based":
        text = text.replace(
            "decider: prefix-based\n    nonCachedTokens: 256\n", f"decider: {decider}\n"
        )
        assert f"decider: {decider}" in text
    result = scheduler(text).schedule(
        request(prompt), pool(Role.PREFILL, Role.DECODE), random.Random(0)
    )
    assert result.decision == expected


def test_threshold_is_configurable() -> None:
    text = default_yaml().replace("nonCachedTokens: 256", "nonCachedTokens: 1")
    result = scheduler(text).schedule(
        request("abcdefgh"), pool(Role.PREFILL, Role.DECODE), random.Random(0)
    )
    assert result.decision == "disaggregated"


def test_prefill_prefers_the_shorter_queue() -> None:
    snap = pool(Role.PREFILL, Role.PREFILL, Role.DECODE)
    busy = snap.endpoints[0]
    states = (
        EndpointState(busy.endpoint, EndpointMetrics(updated_at=NOW, waiting=4, running=0)),
        *snap.endpoints[1:],
    )
    snap = Snapshot(states, snap.in_flight)
    result = scheduler().schedule(request(LONG), snap, random.Random(0))
    assert result.prefill == snap.endpoints[1].endpoint


@settings(max_examples=60, deadline=None)
@given(
    roles=st.lists(st.sampled_from(list(Role)), min_size=1, max_size=8),
    chars=st.integers(min_value=1, max_value=4000),
    seed=st.integers(min_value=0, max_value=2**16),
)
def test_targets_always_decode_and_prefill_always_prefills(
    roles: list[Role], chars: int, seed: int
) -> None:
    snap = pool(*roles)
    try:
        result = scheduler().schedule(request("x" * chars), snap, random.Random(seed))
    except NoEndpointError:
        assert all(r is Role.PREFILL for r in roles)
        return
    members = {s.endpoint for s in snap.endpoints}
    assert all(t in members and t.role in (Role.DECODE, Role.BOTH) for t in result.targets)
    if result.prefill is not None:
        assert result.prefill in members and result.prefill.role in (Role.PREFILL, Role.BOTH)
        assert result.prefill != result.primary
        assert result.decision == "disaggregated"


def test_only_generation_paths_are_disaggregated() -> None:
    req = InferenceRequest("r", "m", "/v1/embeddings", prompt=LONG)
    result = scheduler().schedule(req, pool(Role.PREFILL, Role.DECODE), random.Random(0))
    assert (result.decision, result.prefill) == ("decode-only", None)


def test_long_prompt_cached_in_full_is_not_disaggregated_again() -> None:
    """Longer than the index hashes (256 blocks = 4,096 tokens): the cached *share*
    decides, so a repeat stays on the decode endpoint that holds it."""
    huge = "a very long shared document. " * 1400  # ~10,000 tokens
    sched = scheduler()
    snap = pool(Role.PREFILL, Role.DECODE)
    first = sched.schedule(request(huge), snap, random.Random(1))
    assert first.decision == "disaggregated"
    sched.on_routed(request(huge), first, snap)
    assert sched.schedule(request(huge), snap, random.Random(1)).decision == "decode-only"


def test_prefill_is_never_the_chosen_decode_endpoint_in_a_mixed_pool() -> None:
    snap = pool(Role.BOTH, Role.BOTH, Role.BOTH)
    for seed in range(20):
        result = scheduler().schedule(request(LONG), snap, random.Random(seed))
        assert result.decision == "disaggregated"
        assert result.prefill is not None and result.prefill != result.primary


# -- benefit: local prefill (with the decodes it stalls) against a remote one ---------

SIM_LIKE = LatencyPriors(
    overhead_ms=5.0,
    prefill_ms_per_token=0.05,
    decode_ms_per_token=8.0,
    decode_ms_per_running=0.5,
    max_num_seqs=16,
)
PROMPT_4000 = "y" * 16_000  # 4,000 tokens at 4 characters a token


def benefit_context(
    prompt: str, decode_running: float, prefill_waiting: float = 0.0, prefill_tokens: int = 0
) -> tuple[CycleContext, EndpointState]:
    decode = EndpointState(
        Endpoint("10.0.0.2", 8000, Role.DECODE),
        EndpointMetrics(updated_at=NOW, waiting=0, running=decode_running, kv_usage=0.1),
    )
    prefill = EndpointState(
        Endpoint("10.0.0.1", 8000, Role.PREFILL),
        EndpointMetrics(
            updated_at=NOW, waiting=prefill_waiting, running=min(prefill_waiting, 16), kv_usage=0
        ),
    )
    snap = Snapshot(
        (prefill, decode),
        {prefill.address: 0, decode.address: 0},
        {prefill.address: prefill_tokens},
    )
    ctx = CycleContext(request(prompt), snap, NOW, random.Random(0), latency=LatencyModel(SIM_LIKE))
    return ctx, decode


def test_interference_is_what_each_chunk_adds_beyond_the_decodes_own_step() -> None:
    rate, step = 0.05e-3, 0.016  # 20k prompt tokens/s; 16 decodes: a 16 ms step
    # 4,000 tokens beside 16 decodes: chunks of 2,032 and 1,968 tokens
    expected = (rate * 2048 - step) + (rate * (1968 + 16) - step)
    assert interference_s(rate, step, 16, 4000, 2048) == pytest.approx(expected)
    assert interference_s(rate, step, 16, 100, 2048) == 0  # rides along free
    assert interference_s(rate, step, 0, 4000, 2048) == 0  # nothing running: no stall
    # a smaller step budget: more chunks, each cheaper
    assert interference_s(rate, step, 16, 4000, 512) < expected


def test_benefit_splits_a_long_prompt_off_a_busy_decode_endpoint() -> None:
    ctx, decode = benefit_context(PROMPT_4000, decode_running=16)
    decider = BenefitDecider(2048, 0.005, 1.0)
    local, remote = decider.costs(ctx, decode)
    stall = 16 * interference_s(0.05e-3, 0.016, 16, 4000, 2048)
    assert local == pytest.approx(0.005 + 0.2 + stall)
    assert remote == pytest.approx(0.005 + 0.2 + 4000 * 0.005e-3 + 0.016)
    assert decider.wants_prefill(ctx, decode)


def test_benefit_keeps_the_prefill_local_on_an_idle_decode_endpoint() -> None:
    ctx, decode = benefit_context(PROMPT_4000, decode_running=0)
    decider = BenefitDecider(2048, 0.005, 1.0)
    local, remote = decider.costs(ctx, decode)
    assert remote is not None and local < remote  # the transfer and the hop cost more
    assert not decider.wants_prefill(ctx, decode)


def test_benefit_keeps_a_short_prompt_local_whatever_the_load() -> None:
    ctx, decode = benefit_context("z" * 400, decode_running=16)
    assert not BenefitDecider(2048, 0.005, 1.0).wants_prefill(ctx, decode)


def test_benefit_keeps_the_prefill_local_when_the_prefill_queue_costs_more() -> None:
    ctx, decode = benefit_context(PROMPT_4000, decode_running=16, prefill_waiting=100)
    decider = BenefitDecider(2048, 0.005, 1.0)
    local, remote = decider.costs(ctx, decode)
    assert remote is not None and remote > local
    assert not decider.wants_prefill(ctx, decode)
    # weighing the stalled decodes more tips it back
    assert BenefitDecider(2048, 0.005, 3.0).wants_prefill(ctx, decode)


def test_benefit_without_a_prefill_endpoint_stays_local() -> None:
    ctx, decode = benefit_context(PROMPT_4000, decode_running=16)
    only = Snapshot((decode,), {decode.address: 0})
    ctx = CycleContext(ctx.request, only, NOW, random.Random(0), latency=ctx.latency)
    local, remote = BenefitDecider(2048, 0.005, 1.0).costs(ctx, decode)
    stall = 16 * interference_s(0.05e-3, 0.016, 16, 4000, 2048)
    assert remote is None and local == pytest.approx(0.205 + stall)
    assert not BenefitDecider(2048, 0.005, 1.0).wants_prefill(ctx, decode)


def test_benefit_is_configured_by_name() -> None:
    text = default_yaml().replace(
        "decider: prefix-based\n    nonCachedTokens: 256\n",
        "decider: benefit\n    stepTokens: 512\n    transferMsPerToken: 0.01\n",
    )
    assert "decider: benefit" in text
    result = scheduler(text).schedule(
        request(SHORT), pool(Role.PREFILL, Role.DECODE), random.Random(0)
    )
    assert result.decision == "decode-only"


def test_benefit_counts_the_prompt_tokens_a_prefill_server_is_already_computing() -> None:
    decider = BenefitDecider(2048, 0.005, 1.0)
    ctx, decode = benefit_context(PROMPT_4000, decode_running=16, prefill_tokens=40_000)
    _, remote = decider.costs(ctx, decode)
    assert remote == pytest.approx(0.005 + 0.05e-3 * 44_000 + 4000 * 0.005e-3 + 0.016)
    assert decider.wants_prefill(ctx, decode)  # 2.2 s there still beats 2.9 s here
    ctx, decode = benefit_context(PROMPT_4000, decode_running=16, prefill_tokens=60_000)
    assert not decider.wants_prefill(ctx, decode)


class EngineCount:
    """A cache estimate that knows the prompt's length in the engine's tokens, as the
    precise prefix-cache scorer does once it tokenized the prompt; nothing cached."""

    def __init__(self, tokens: int) -> None:
        self.tokens = tokens

    def cached_fraction(self, ctx: CycleContext, address: str) -> float:
        return 0.0

    def prompt_tokens(self, ctx: CycleContext) -> int:
        return self.tokens


@pytest.mark.parametrize(
    ("chars", "engine_tokens", "wanted"),
    [
        (800, None, False),  # 200 estimated tokens: under the threshold
        (800, 800, True),  # the engine counts 800: over it
        (1200, None, True),  # 300 estimated
        (1200, 100, False),  # the engine counts 100
    ],
)
def test_prefix_based_decider_counts_the_engines_tokens_when_known(
    chars: int, engine_tokens: int | None, wanted: bool
) -> None:
    snap = pool(Role.PREFILL, Role.DECODE)
    ctx = CycleContext(request("x" * chars), snap, NOW, random.Random(0))
    decider = PrefixBasedDecider(non_cached_tokens=256)
    decider.use_cache_estimate(None if engine_tokens is None else EngineCount(engine_tokens))
    assert decider.wants_prefill(ctx, snap.endpoints[1]) is wanted
