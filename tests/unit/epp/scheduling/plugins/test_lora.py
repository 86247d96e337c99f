"""LoRA affinity: the tiers, the order (active, then loading or a free slot, then full;
within each, the shortest predicted wait), inactive on pools without LoRA state, and the
default config's picks unchanged on such a pool."""

from __future__ import annotations

import random

import yaml

from epp.common.params import Params
from epp.config import build_scheduler
from epp.scheduling import defaults
from epp.scheduling.base import CycleContext
from epp.scheduling.plugins import lora
from epp.scheduling.plugins.lora import Tier
from epp.scheduling.plugins.prefix import prefix_cache_scorer
from epp.types import (
    Endpoint,
    EndpointMetrics,
    EndpointState,
    InferenceRequest,
    SchedulingResult,
    Snapshot,
)

NOW = 100.0
P = Params("test", {})


def state(port: int, **metrics: object) -> EndpointState:
    m = EndpointMetrics(updated_at=NOW, **metrics) if metrics else None  # type: ignore[arg-type]
    return EndpointState(Endpoint("10.0.0.1", port), m)


def ctx(
    states: list[EndpointState], model: str = "sql", flagged: bool = False, **in_flight: int
) -> CycleContext:
    flights = {f"10.0.0.1:{k.removeprefix('p')}": v for k, v in in_flight.items()}
    req = InferenceRequest("r", model, "/v1/completions", lora_adapter=flagged)
    return CycleContext(req, Snapshot(tuple(states), flights), NOW, random.Random(0))


def ports(states: list[EndpointState] | tuple[EndpointState, ...]) -> list[int]:
    return [s.endpoint.port for s in states]


def test_tier_of_each_reported_state() -> None:
    def m(
        running: set[str], waiting: frozenset[str] = frozenset(), slots: int | None = 2
    ) -> EndpointMetrics:
        return EndpointMetrics(NOW, lora_running=frozenset(running),
                               lora_waiting=frozenset(waiting), max_lora=slots)  # fmt: skip

    assert lora.tier(None, "a") is None
    assert lora.tier(m(set(), slots=None), "a") is None
    assert lora.tier(m({"a", "b"}), "a") is Tier.ACTIVE
    assert lora.tier(m({"b", "c"}, {"a"}), "a") is Tier.LOADING
    assert lora.tier(m({"b"}), "a") is Tier.FREE
    assert lora.tier(m(set(), slots=0), "a") is Tier.FULL  # max_lora 0: never a slot
    assert lora.tier(m({"b", "c"}), "a") is Tier.FULL


def test_order_active_then_loading_or_free_then_full_each_by_predicted_wait() -> None:
    # slot counts known to the latency model (vLLM's max_num_seqs): 2 each
    states = [
        state(1, max_lora=2, lora_running=frozenset({"b", "c"}), running=2, waiting=0),  # full
        state(2, max_lora=2, lora_running=frozenset({"b"}), running=2, waiting=6),  # free, busy
        state(3, max_lora=2, lora_running=frozenset({"sql"}), running=2, waiting=8),  # active, busy
        state(4, max_lora=2, lora_running=frozenset({"b", "c"}), lora_waiting=frozenset({"sql"}),
              running=1, waiting=1),  # loading
        state(5, max_lora=2, lora_running=frozenset({"sql"}), running=1, waiting=0),  # active, idle
        state(6, max_lora=2, lora_running=frozenset(), running=0, waiting=0),  # free, idle
        state(7),  # no LoRA state
    ]  # fmt: skip
    c = ctx(states)
    for s in states:  # learn the slot count as the model would from queued reports
        c.latency.endpoint(s).configured_slots = 2
    scores = lora.lora_affinity_scorer(P).score(c, states)
    order = [p for _, p in sorted(zip(scores, ports(states), strict=True), reverse=True)]
    assert order == [5, 3, 6, 4, 2, 1, 7]
    assert ports(lora.lora_affinity_filter(P).filter(c, states)) == [3, 5]
    no_active = [s for s in states if s.endpoint.port not in (3, 5)]
    assert ports(lora.lora_affinity_filter(P).filter(ctx(no_active), no_active)) == [2, 4, 6]
    full = [states[0], states[6]]
    c = ctx(full, flagged=True)
    assert lora.lora_affinity_filter(P).filter(c, full) == full  # nowhere a slot: all stay


def test_a_model_nobody_knows_as_an_adapter_is_left_alone_unless_flagged() -> None:
    states = [
        state(1, max_lora=1, lora_running=frozenset({"b"})),
        state(2, max_lora=1, lora_running=frozenset()),
    ]
    base = ctx(states, model="base-model")
    assert lora.lora_affinity_filter(P).filter(base, states) == states
    assert lora.lora_affinity_scorer(P).score(base, states) == [0.0, 0.0]
    flagged = ctx(states, model="new-adapter", flagged=True)  # in the EPP's catalogue
    assert ports(lora.lora_affinity_filter(P).filter(flagged, states)) == [2]


def test_inactive_on_a_pool_without_lora_state() -> None:
    states = [state(1, waiting=3), state(2, running=1), state(3)]
    c = ctx(states, flagged=True)
    assert lora.lora_affinity_filter(P).filter(c, states) is states
    assert lora.lora_affinity_scorer(P).score(c, states) == [0.0, 0.0, 0.0]


def without_lora_plugins() -> str:
    """The built-in default config as YAML, minus the LoRA plugins."""
    plugins = [p for p in defaults.PLUGINS if not p["type"].startswith("lora-")]
    profiles = [
        {**prof, "plugins": [r for r in prof["plugins"] if not r["pluginRef"].startswith("lora-")]}
        for prof in defaults.PROFILES
    ]
    return yaml.safe_dump({"plugins": plugins, "schedulingProfiles": profiles})


def test_default_picks_are_unchanged_on_a_pool_without_lora() -> None:
    with_lora = build_scheduler("{}", clock=lambda: NOW)
    plain = build_scheduler(without_lora_plugins(), clock=lambda: NOW)
    data = random.Random(7)
    for n in range(300):
        states = tuple(
            state(port, waiting=data.randint(0, 5), running=data.randint(0, 4),
                  kv_usage=data.random())
            for port in range(1, 2 + data.randint(0, 70))
        )  # fmt: skip
        in_flight = {s.address: data.randint(0, 3) for s in states}
        snap = Snapshot(states, in_flight)
        prompt = "shared system prompt " * data.randint(0, 40) + str(n % 5)
        req = InferenceRequest(f"r{n}", data.choice(["m", "sql"]), "/v1/completions", prompt=prompt)
        a = with_lora.schedule(req, snap, random.Random(n))
        b = plain.schedule(req, snap, random.Random(n))
        assert a.targets == b.targets and a.prefill == b.prefill
        with_lora.on_routed(req, a, snap)
        plain.on_routed(req, b, snap)


def test_the_default_config_follows_the_adapter() -> None:
    sched = build_scheduler("{}", clock=lambda: NOW)
    states = (
        state(1, max_lora=2, lora_running=frozenset({"b"}), waiting=0, running=1),
        state(2, max_lora=2, lora_running=frozenset({"sql"}), waiting=1, running=3),
        state(3, max_lora=2, lora_running=frozenset({"b", "c"}), waiting=0, running=0),
    )
    snap = Snapshot(states, {})
    req = InferenceRequest("r", "sql", "/v1/completions", prompt="x" * 100)
    assert sched.schedule(req, snap, random.Random(0)).primary.port == 2
    other = InferenceRequest("r", "d", "/v1/completions", prompt="x" * 100, lora_adapter=True)
    assert sched.schedule(other, snap, random.Random(0)).primary.port == 1  # the free slot


def test_the_prefix_index_keys_by_adapter() -> None:
    """The same prompt under two adapters is two caches (vLLM keys cached blocks by
    adapter too): what was routed for one adapter is no hit for the other."""
    scorer = prefix_cache_scorer(P)
    states = [state(1), state(2)]
    prompt = "the same long system prompt " * 20
    first = CycleContext(
        InferenceRequest("r1", "sql", "/v1/completions", prompt=prompt),
        Snapshot(tuple(states), {}), NOW, random.Random(0),
    )  # fmt: skip
    scorer.score(first, states)
    scorer.on_routed(first.request, SchedulingResult((states[0].endpoint,)), first.snapshot)
    same = CycleContext(
        InferenceRequest("r2", "sql", "/v1/completions", prompt=prompt),
        first.snapshot, NOW, random.Random(0),
    )  # fmt: skip
    other = CycleContext(
        InferenceRequest("r3", "chat", "/v1/completions", prompt=prompt),
        first.snapshot, NOW, random.Random(0),
    )  # fmt: skip
    assert scorer.score(same, states)[0] == 1.0
    assert list(scorer.score(other, states)) == [0.0, 0.0]


def test_the_scorer_remembers_where_an_idle_adapter_probably_still_sits() -> None:
    """Servers list only adapters in use: once sql's requests end on port 2, both ports
    look alike (free slots); the scorer remembers it routed sql to port 2 last, so sql
    goes back there (no swap) even though port 2 is a little busier."""
    scorer = lora.lora_affinity_scorer(P)
    states = [
        state(1, max_lora=2, lora_running=frozenset(), running=0, waiting=0),
        state(2, max_lora=2, lora_running=frozenset(), running=1, waiting=1),
    ]
    c = ctx(states, flagged=True)
    before = scorer.score(c, states)
    assert before[0] > before[1]  # nothing remembered: the idle one
    scorer.on_routed(c.request, SchedulingResult((states[1].endpoint,)), c.snapshot)
    after = scorer.score(ctx(states, flagged=True), states)
    assert after[1] > after[0]
    # it keeps only max_lora adapters per endpoint: two others push sql out
    for other in ("x", "y"):
        r = InferenceRequest("r", other, "/v1/completions", lora_adapter=True)
        scorer.on_routed(r, SchedulingResult((states[1].endpoint,)), c.snapshot)
    again = scorer.score(ctx(states, flagged=True), states)
    assert again[0] > again[1]
