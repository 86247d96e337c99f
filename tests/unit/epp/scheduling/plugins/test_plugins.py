"""Every filter, scorer and picker on plain snapshots, plus framework properties."""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Container, Mapping

import pytest
from hypothesis import given
from hypothesis import strategies as st

from epp.common.params import Params
from epp.config import build_scheduler
from epp.errors import NoEndpointError
from epp.scheduling.base import CycleContext
from epp.scheduling.latency import LatencyModel, LatencyPriors
from epp.scheduling.plugins import affinity, filters, load, pickers, prefix
from epp.scheduling.prefixindex import PrefixIndex, block_hashes
from epp.types import (
    Endpoint,
    EndpointMetrics,
    EndpointState,
    InferenceRequest,
    Role,
    SchedulingResult,
    Snapshot,
)

NOW = 100.0


def state(
    port: int,
    role: Role = Role.DECODE,
    labels: Mapping[str, str] | None = None,
    age: float = 0.0,
    **metrics: object,
) -> EndpointState:
    m = EndpointMetrics(updated_at=NOW - age, **metrics) if metrics else None  # type: ignore[arg-type]
    return EndpointState(Endpoint("10.0.0.1", port, role, labels or {}), m)


def ctx(
    states: list[EndpointState],
    request: InferenceRequest | None = None,
    in_flight: dict[str, int] | None = None,
    tokens: dict[str, int] | None = None,
) -> CycleContext:
    snap = Snapshot(tuple(states), in_flight or {}, tokens or {})
    req = request or InferenceRequest("r", "m", "/v1/completions")
    return CycleContext(req, snap, NOW, random.Random(0), stale_after_s=2.0)


P = Params("test", {})


def test_relative_scores() -> None:
    assert load.relative([0, 5, 10]) == [1.0, 0.5, 0.0]
    assert load.relative([3, 3]) == [1.0, 1.0]
    assert load.relative([None, 2, 4]) == [0.0, 1.0, 0.0]
    assert load.relative([None, None]) == [0.0, 0.0]


def test_threshold_normalization_is_absolute() -> None:
    assert load.against_threshold([0, 1, 5, 9, None], 5) == [1.0, 0.8, 0.0, 0.0, 0.0]
    states = [state(1, waiting=0), state(2, waiting=1)]
    scorer = load.queue_scorer(Params("t", {"normalize": "threshold", "threshold": 4}))
    assert scorer.score(ctx(states), states) == [1.0, 0.75]


def test_queue_running_kv_scorers_and_staleness() -> None:
    states = [
        state(1, waiting=0, running=4, kv_usage=0.9),
        state(2, waiting=4, running=0, kv_usage=0.1),
        state(3, age=5.0, waiting=0, running=0, kv_usage=0.0),  # stale = unknown
        state(4),  # never reported
    ]
    c = ctx(states)
    assert load.queue_scorer(P).score(c, states) == [1.0, 0.0, 0.0, 0.0]
    assert load.running_requests_scorer(P).score(c, states) == [0.0, 1.0, 0.0, 0.0]
    assert load.kv_cache_scorer(P).score(c, states) == pytest.approx([0.1, 0.9, 0.0, 0.0])


def test_in_flight_scorer_requests_and_tokens() -> None:
    states = [state(1), state(2)]
    c = ctx(states, in_flight={"10.0.0.1:1": 3}, tokens={"10.0.0.1:2": 900})
    assert load.in_flight_scorer(P).score(c, states) == [0.0, 1.0]
    tok = load.in_flight_scorer(Params("t", {"unit": "tokens"}))
    assert tok.score(c, states) == [1.0, 0.0]


def test_orca_scorer_reads_the_configured_key() -> None:
    states = [
        state(1, orca={"application_utilization": 0.25}),
        state(2, orca={"cpu_utilization": 0.1}),
    ]
    scorer = affinity.orca_scorer(P)
    assert scorer.score(ctx(states), states) == [0.75, 0.0]
    cpu = affinity.orca_scorer(Params("t", {"metric": "cpu_utilization"}))
    assert cpu.score(ctx(states), states) == pytest.approx([0.0, 0.9])


def test_session_affinity_follows_the_last_routing() -> None:
    scorer = affinity.session_affinity_scorer(Params("t", {"maxSessions": 1}))
    states = [state(1), state(2)]
    req = InferenceRequest("r", "m", "/", headers={"x-session-id": "s1"})
    assert scorer.score(ctx(states, req), states) == [0.0, 0.0]
    snap = Snapshot(tuple(states), {})
    scorer.on_routed(req, SchedulingResult((states[1].endpoint,)), snap)
    assert scorer.score(ctx(states, req), states) == [0.0, 1.0]
    other = InferenceRequest("r", "m", "/", headers={"x-session-id": "s2"})
    scorer.on_routed(other, SchedulingResult((states[0].endpoint,)), snap)
    assert scorer.score(ctx(states, req), states) == [0.0, 0.0]  # s1 evicted (max 1)


def test_role_label_and_saturation_filters() -> None:
    states = [
        state(1, Role.PREFILL, {"zone": "a"}, waiting=10),
        state(2, Role.DECODE, {"zone": "b"}, waiting=0, kv_usage=0.1),
        state(3, Role.BOTH, {"zone": "a"}, kv_usage=0.95),
    ]
    c = ctx(states)
    assert [s.endpoint.port for s in filters.decode_filter(P).filter(c, states)] == [2, 3]
    assert [s.endpoint.port for s in filters.prefill_filter(P).filter(c, states)] == [1, 3]
    roles = filters.role_filter(Params("t", {"roles": ["both"]}))
    assert [s.endpoint.port for s in roles.filter(c, states)] == [3]
    zone = filters.label_selector_filter(Params("t", {"matchLabels": {"zone": "a"}}))
    assert [s.endpoint.port for s in zone.filter(c, states)] == [1, 3]
    sat = filters.saturation_filter(P)
    assert [s.endpoint.port for s in sat.filter(c, states)] == [2]
    assert sat.filter(c, [states[0]]) == [states[0]]  # all saturated: keep all


def test_pickers_return_distinct_candidates_best_first() -> None:
    states = [state(i) for i in range(1, 6)]
    scored = list(zip(states, [0.1, 0.9, 0.5, 0.9, 0.0], strict=True))
    c = ctx(states)
    top = pickers.max_score_picker(Params("t", {"maxTargets": 3})).pick(c, scored)
    assert {s.endpoint.port for s in top[:2]} == {2, 4} and top[2].endpoint.port == 3
    rnd = pickers.random_picker(Params("t", {"maxTargets": 2})).pick(c, scored)
    assert len({s.address for s in rnd}) == 2
    weighted = pickers.weighted_random_picker(Params("t", {"maxTargets": 5})).pick(c, scored)
    assert weighted[-1].endpoint.port == 5  # zero weight is last
    assert pickers.max_score_picker(P).pick(c, []) == []


def test_weighted_random_follows_weights() -> None:
    states = [state(1), state(2)]
    scored = [(states[0], 3.0), (states[1], 1.0)]
    picker = pickers.weighted_random_picker(P)
    c = ctx(states)
    wins = sum(picker.pick(c, scored)[0].endpoint.port == 1 for _ in range(4000))
    assert 0.70 < wins / 4000 < 0.80


def test_prefix_index_matches_longest_prefix_and_evicts() -> None:
    index = PrefixIndex(default_capacity=4)
    a = block_hashes("m", "x" * 64 * 3, 64, 256)
    b = block_hashes("m", "x" * 64 * 2 + "y" * 64, 64, 256)
    assert a[:2] == b[:2] and a[2] != b[2]
    assert block_hashes("other-model", "x" * 64 * 3, 64, 256) != a  # seeded by model
    index.insert("e1", a)
    index.insert("e2", b[:1])
    assert index.match(b) == {"e1": 2, "e2": 1}
    index.insert("e1", block_hashes("m", "z" * 64 * 3, 64, 256))  # 6 blocks > capacity 4
    assert index.size() == 5 and index.match(a) == {"e2": 1}
    index.retain({"e1"})
    assert index.match(b) == {}


@given(
    st.lists(st.text(alphabet="abc", min_size=0, max_size=400), min_size=1, max_size=30),
    st.integers(1, 8),
)
def test_prefix_index_never_exceeds_its_bound(prompts: list[str], capacity: int) -> None:
    index = PrefixIndex(capacity)
    for i, p in enumerate(prompts):
        index.insert(f"e{i % 3}", block_hashes("m", p, 16, 256))
    assert index.size() <= 3 * capacity


def leading_blocks(held: Mapping[str, Container[int]], wanted: list[int]) -> dict[str, int]:
    """What a prefix index should answer: per endpoint, how many of ``wanted``'s leading
    blocks it holds (endpoints holding none left out)."""
    expected = {}
    for address, hashes in held.items():
        leading = next((i for i, h in enumerate(wanted) if h not in hashes), len(wanted))
        if leading:
            expected[address] = leading
    return expected


@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.text(alphabet="ab", max_size=12)), min_size=1, max_size=12
    ),
    st.text(alphabet="ab", max_size=12),
)
def test_prefix_index_match_counts_each_endpoints_leading_blocks(
    inserts: list[tuple[int, str]], query: str
) -> None:
    index = PrefixIndex(default_capacity=10_000)  # nothing evicted: holdings are the unions
    held: dict[str, set[int]] = {}
    for endpoint, prompt in inserts:
        hashes = block_hashes("m", prompt, 2, 256)
        index.insert(f"e{endpoint}", hashes)
        held.setdefault(f"e{endpoint}", set()).update(hashes)
    wanted = block_hashes("m", query, 2, 256)
    assert index.match(wanted) == leading_blocks(held, wanted)


@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("insert"), st.integers(0, 4), st.text(alphabet="ab", max_size=10)),
            st.tuples(st.just("retain"), st.sets(st.integers(0, 4)), st.just("")),
        ),
        min_size=1,
        max_size=25,
    ),
    st.integers(1, 6),
    st.text(alphabet="ab", max_size=10),
)
def test_prefix_index_follows_each_endpoints_lru_through_evictions_and_removals(
    ops: list[tuple[str, object, str]], capacity: int, query: str
) -> None:
    """Against a model: one LRU per endpoint, forgotten endpoints gone (their slots in
    the index are reused by later endpoints without inheriting anything)."""
    index = PrefixIndex(default_capacity=capacity)
    model: dict[str, OrderedDict[int, None]] = {}
    for op, arg, prompt in ops:
        if op == "insert":
            address, hashes = f"e{arg}", block_hashes("m", prompt, 2, 256)
            index.insert(address, hashes)
            lru = model.setdefault(address, OrderedDict())
            for h in hashes:
                lru[h] = None
                lru.move_to_end(h)
            while len(lru) > capacity:
                lru.popitem(last=False)
        else:
            keep = {f"e{i}" for i in arg}  # type: ignore[attr-defined]
            index.retain(keep)
            model = {a: lru for a, lru in model.items() if a in keep}
    wanted = block_hashes("m", query, 2, 256)
    assert index.match(wanted) == leading_blocks(model, wanted)
    assert index.size() == sum(len(lru) for lru in model.values())


@given(
    st.lists(
        st.tuples(
            st.integers(0, 4),
            st.lists(st.integers(0, 9), max_size=8),  # raw hashes: repeats within one list
            st.sampled_from([None, 1, 2, 3]),  # per-insert capacity (an endpoint's free KV)
        ),
        min_size=1,
        max_size=20,
    ),
    st.lists(st.integers(0, 9), max_size=8),
)
def test_prefix_index_follows_the_lru_with_repeated_hashes_and_changing_capacity(
    inserts: list[tuple[int, list[int], int | None]], wanted: list[int]
) -> None:
    index = PrefixIndex(default_capacity=4)
    model: dict[str, OrderedDict[int, None]] = {}
    for endpoint, hashes, capacity in inserts:
        index.insert(f"e{endpoint}", hashes, capacity)
        lru = model.setdefault(f"e{endpoint}", OrderedDict())
        for h in hashes:
            lru[h] = None
            lru.move_to_end(h)
        while len(lru) > (capacity or 4):
            lru.popitem(last=False)
    assert index.match(wanted) == leading_blocks(model, wanted)
    assert index.size() == sum(len(lru) for lru in model.values())


def test_prefix_scorer_scores_matched_fraction_and_uses_reported_capacity() -> None:
    scorer = prefix.prefix_cache_scorer(Params("t", {"blockSize": 4}))  # 16 chars/block
    states = [state(1, num_blocks=2, block_size=4), state(2)]
    req = InferenceRequest("r", "m", "/", prompt="p" * 64)  # 4 blocks
    snap = Snapshot(tuple(states), {})
    scorer.on_routed(req, SchedulingResult((states[0].endpoint,)), snap)
    # endpoint 1 reports 2 blocks of 4 tokens = 2 of our blocks: only 2 kept (LRU)
    assert scorer.index.size() == 2
    c = ctx(states, req)
    assert scorer.score(c, states) == [0.0, 0.0]  # the first blocks were evicted
    scorer.on_routed(req, SchedulingResult((states[1].endpoint,)), snap)
    assert scorer.score(ctx(states, req), states) == [0.0, 1.0]
    short = InferenceRequest("r", "m", "/", prompt="tiny")
    assert scorer.score(ctx(states, short), states) == [0.0, 0.0]


def test_default_scheduler_prefers_cached_prefix_and_spreads_others() -> None:
    sched = build_scheduler("{}", clock=lambda: NOW)
    states = tuple(state(p, waiting=0, kv_usage=0.2) for p in (1, 2, 3, 4))
    snap = Snapshot(states, {})
    rng = random.Random(3)
    shared = "You are a helpful assistant. " * 40
    first = InferenceRequest("r", "m", "/", prompt=shared + "q1")
    target = sched.schedule(first, snap, rng)
    sched.on_routed(first, target, snap)
    for i in range(10):
        again = InferenceRequest("r", "m", "/", prompt=shared + f"question {i}")
        assert sched.schedule(again, snap, rng).primary == target.primary
    others = {
        sched.schedule(InferenceRequest("r", "m", "/", prompt=f"{i}" * 300), snap, rng).primary
        for i in range(40)
    }
    assert len(others) == 4  # no prefix: ties broken at random


def test_subset_hint_and_room() -> None:
    sched = build_scheduler("{}", clock=lambda: NOW)
    saturated = tuple(state(p, waiting=10, kv_usage=0.9) for p in (1, 2))
    snap = Snapshot(saturated, {})
    rng = random.Random()
    hinted = InferenceRequest("r", "m", "/", subset=frozenset({"10.0.0.1:2"}))
    assert sched.schedule(hinted, snap, rng).primary.port == 2
    with pytest.raises(NoEndpointError) as info:
        sched.schedule(InferenceRequest("r", "m", "/", subset=frozenset({"9.9.9.9:1"})), snap, rng)
    assert "subset" in info.value.message
    sheddable = InferenceRequest("r", "m", "/", headers={"x-gateway-inference-priority": "-1"})
    assert sched.priority(sheddable) == -1
    assert sched.room(sheddable, snap) is False  # full by their reports
    # scheduling itself never sheds: admission (the router's flow control) does
    assert sched.schedule(sheddable, snap, rng).primary.port in (1, 2)
    calm = Snapshot(tuple(state(p, waiting=0, kv_usage=0.1) for p in (1, 2)), {})
    assert sched.room(sheddable, calm) is True
    addresses = [s.address for s in calm.endpoints]
    at_limit = build_scheduler("saturationDetector: {maxConcurrency: 2}", clock=lambda: NOW)
    one_full = Snapshot(calm.endpoints, {addresses[0]: 2})
    assert at_limit.room(sheddable, one_full) == frozenset({addresses[1]})
    assert at_limit.room(sheddable, Snapshot(calm.endpoints, dict.fromkeys(addresses, 2))) is False
    # a stale report says nothing: only the limit counts
    stale = build_scheduler("dataLayer: {staleAfterSeconds: 0.001}", clock=lambda: NOW + 10)
    assert stale.room(sheddable, snap) is True
    # an objective maps to a priority, by the llm-d name or its alias
    mapped = build_scheduler("admission: {objectives: {batch: -2, chat: 3}}")
    for name in ("x-llm-d-inference-objective", "x-gateway-inference-objective"):
        assert mapped.priority(InferenceRequest("r", "m", "/", headers={name: "batch"})) == -2
    both = {"x-gateway-inference-priority": "7", "x-llm-d-inference-objective": "chat"}
    assert mapped.priority(InferenceRequest("r", "m", "/", headers=both)) == 7


@pytest.mark.parametrize("vectorize_from", [1, 1000])
def test_room_learns_slots_from_a_queue_it_sees(vectorize_from: int) -> None:
    # slots unknown: a report of requests waiting makes the running count the limit, and
    # room learns it then, not only when a request is routed there (after the queue has
    # drained, the next report says 0 waiting and would leave the endpoint unlimited)
    sched = build_scheduler("{}", clock=lambda: NOW)
    sched.vectorize_from = vectorize_from
    request = InferenceRequest("r", "m", "/")
    other = state(2, waiting=0.0, running=1.0)
    queued = Snapshot((state(1, waiting=1.0, running=2.0), other), {"10.0.0.1:1": 3})
    assert sched.room(request, queued) == frozenset({other.address})
    drained = (state(1, waiting=0.0, running=2.0), other)
    assert sched.room(request, Snapshot(drained, {"10.0.0.1:1": 2})) == frozenset({other.address})
    assert sched.room(request, Snapshot(drained, {"10.0.0.1:1": 1})) is True


def test_objective_maps_to_priority() -> None:
    sched = build_scheduler("admission: {objectives: {batch: -1}}", clock=lambda: NOW)
    batch = InferenceRequest("r", "m", "/", headers={"x-gateway-inference-objective": "batch"})
    assert sched.priority(batch) == -1
    chat = InferenceRequest("r", "m", "/", headers={"x-gateway-inference-objective": "chat"})
    assert sched.priority(chat) == 0  # unknown objective: the default


def test_watched_objectives_give_priorities_and_the_config_wins() -> None:
    sched = build_scheduler("admission: {objectives: {batch: -1}}", clock=lambda: NOW)
    sched.objectives = {"batch": 5, "critical": 10}  # InferenceObjectives (discovery)

    def priority(**headers: str) -> int:
        return sched.priority(InferenceRequest("r", "m", "/", headers=headers))

    assert priority(**{"x-llm-d-inference-objective": "critical"}) == 10
    assert priority(**{"x-gateway-inference-objective": "batch"}) == -1  # the config's
    assert priority(**{"x-gateway-inference-objective": "unknown"}) == 0
    both = {"x-gateway-inference-priority": "-3", "x-gateway-inference-objective": "critical"}
    assert priority(**both) == -3  # the priority header says otherwise


@given(
    st.lists(
        st.tuples(
            st.integers(0, 20),
            st.floats(0, 1),
            st.integers(0, 10),
            st.sampled_from(list(Role)),
            st.floats(0, 5),
        ),
        min_size=1,
        max_size=12,
    ),
    st.text(max_size=300),
    st.integers(),
)
def test_any_pick_is_a_candidate(
    specs: list[tuple[int, float, int, Role, float]], prompt: str, seed: int
) -> None:
    states = tuple(
        state(i + 1, role, age=age, waiting=w, kv_usage=kv)
        for i, (w, kv, _, role, age) in enumerate(specs)
    )
    in_flight = {s.address: n for s, (_, _, n, _, _) in zip(states, specs, strict=True)}
    snap = Snapshot(states, in_flight)
    sched = build_scheduler("{}", clock=lambda: NOW)
    req = InferenceRequest("r", "m", "/", prompt=prompt)
    decoders = [s.endpoint for s in states if s.endpoint.role is not Role.PREFILL]
    try:
        result = sched.schedule(req, snap, random.Random(seed))
    except NoEndpointError:
        assert not decoders
        return
    assert result.primary in decoders


SCORER_TYPES = [
    "queue-scorer",
    "running-requests-scorer",
    "kv-cache-utilization-scorer",
    "in-flight-load-scorer",
    "prefix-cache-scorer",
    "lora-affinity-scorer",
    "orca-scorer",
    "session-affinity-scorer",
]


@given(
    st.lists(
        st.tuples(
            st.floats(0, 1e6),
            st.floats(0, 1e6),
            st.floats(0, 1),
            st.integers(0, 100),
            st.floats(0, 1),
            st.floats(0, 10),
        ),
        min_size=1,
        max_size=10,
    ),
    st.text(max_size=200),
)
def test_builtin_scores_stay_in_unit_range(
    specs: list[tuple[float, float, float, int, float, float]], prompt: str
) -> None:
    from epp.config import builtin_registry

    states = [
        state(
            i + 1, age=age, waiting=w, running=r, kv_usage=kv, orca={"application_utilization": u}
        )
        for i, (w, r, kv, _, u, age) in enumerate(specs)
    ]
    in_flight = {s.address: n for s, (_, _, _, n, _, _) in zip(states, specs, strict=True)}
    c = ctx(states, InferenceRequest("r", "m", "/", prompt=prompt), in_flight, in_flight)
    registry = builtin_registry()
    for name in SCORER_TYPES:
        scores = registry.get(name, "test").factory(Params(name, {})).score(c, states)
        assert len(scores) == len(states)
        assert all(0.0 <= x <= 1.0 for x in scores), (name, scores)


def test_prefix_index_capacity_shrinks_with_the_servers_kv_usage() -> None:
    """A busy server evicts cached prefixes for its running requests; the index forgets
    what no longer fits (here: geometry 64 blocks x 16 tokens, 75 % in use -> 16 left)."""
    busy = state(1, kv_usage=0.75, num_blocks=64, block_size=16)
    snap = Snapshot((busy,), {})
    scorer = prefix.prefix_cache_scorer(Params("t", {}))
    for i in range(3):  # three prompts of 10 blocks each; only the newest fits
        req = InferenceRequest(str(i), "m", "/", prompt=f"{i}" * 640)
        scorer.on_routed(req, SchedulingResult((busy.endpoint,)), snap)
    assert scorer.index.size() == 16
    assert scorer._capacity(busy.metrics, 4.0) == 16
    fixed = prefix.prefix_cache_scorer(Params("t", {"shrinkWithKvUsage": False}))
    assert fixed._capacity(busy.metrics, 4.0) == 64


def test_a_byte_tokenizer_gives_the_index_a_quarter_of_the_blocks_in_characters() -> None:
    """The server reports its KV in tokens; the index counts 64-character blocks. With
    1 character a token (as learned), 64 x 16 tokens hold 16 of them, not 64, and the
    index forgets what no longer fits."""
    server = state(1, num_blocks=64, block_size=16)
    snap = Snapshot((server,), {})
    scorer = prefix.prefix_cache_scorer(Params("t", {}))
    assert scorer._capacity(server.metrics, 1.0) == 16
    for i in range(3):  # three prompts of 10 blocks each; only the newest fits
        req = InferenceRequest(str(i), "m", "/", prompt=f"{i}" * 640, chars_per_token=1.0)
        assert req.prompt_tokens == 640
        assert scorer.block_tokens_of(req) == 64.0
        scorer.on_routed(req, SchedulingResult((server.endpoint,)), snap)
    assert scorer.index.size() == 16
    assert scorer.free_blocks(server, 1.0) == 0  # full: 16 held of 16
    assert scorer.free_blocks(server, 4.0) == 48  # 16 held of 64


def test_prefix_score_is_withheld_from_an_endpoint_far_above_the_mean_load() -> None:
    states = [state(1), state(2), state(3)]
    req = InferenceRequest("r", "m", "/", prompt="shared system prompt " * 40)
    scorer = prefix.prefix_cache_scorer(Params("t", {}))  # default loadBound 1.25
    snap = Snapshot(tuple(states), {})
    for s in states:  # every endpoint holds the prefix
        scorer.on_routed(req, SchedulingResult((s.endpoint,)), snap)
    c = ctx(states, req, in_flight={states[0].address: 9, states[1].address: 1})
    scores = scorer.score(c, states)
    assert scores[0] == 0.0  # 9 > 1.25 x mean(3.33) + 1
    assert scores[1] == scores[2] == 1.0
    loads = {states[0].address: 4, states[1].address: 2, states[2].address: 2}
    c = ctx(states, req, in_flight=loads)
    assert scorer.score(c, states)[0] == 1.0  # 4 <= 1.25 x 2.67 + 1 = 4.33
    unbounded = prefix.prefix_cache_scorer(Params("t", {"loadBound": 0}))
    for s in states:
        unbounded.on_routed(req, SchedulingResult((s.endpoint,)), snap)
    assert unbounded.score(ctx(states, req, in_flight={states[0].address: 9}), states)[0] == 1.0


@pytest.mark.parametrize("vectorize_from", [64, 1])  # the loop and the numpy columns
def test_a_bound_that_keeps_free_slots_spills_only_a_full_endpoint(vectorize_from: int) -> None:
    states = [state(1), state(2), state(3)]
    req = InferenceRequest("r", "m", "/", prompt="shared system prompt " * 40)
    scorer = prefix.prefix_cache_scorer(Params("t", {"loadBoundKeepsFreeSlot": True}))
    snap = Snapshot(tuple(states), {})
    for s in states:
        scorer.on_routed(req, SchedulingResult((s.endpoint,)), snap)

    def score(home_load: int, latency: LatencyModel) -> float:
        snapshot = Snapshot(tuple(states), {states[0].address: home_load})
        c = CycleContext(req, snapshot, NOW, random.Random(0), latency=latency)
        c.vectorize_from = vectorize_from
        return float(scorer.score(c, states)[0])

    four = LatencyModel(LatencyPriors(max_num_seqs=4))
    assert score(3, four) == 1.0  # 3 > 1.25 x mean(1) + 1, but one of its 4 slots is free
    assert score(4, four) == 0.0  # full and above the bound: spill
    assert score(3, LatencyModel()) == 0.0  # slots unknown: the bound alone


def test_room_on_numpy_columns_agrees_with_the_loop() -> None:
    rng = random.Random(5)
    for case in range(40):
        fixed = rng.choice([None, 2, 3])
        text = f"saturationDetector: {{maxConcurrency: {fixed}}}" if fixed else "{}"
        sched = build_scheduler(text, clock=lambda: NOW)
        states = tuple(
            state(
                p,
                rng.choice([Role.DECODE, Role.DECODE, Role.PREFILL]),
                age=rng.choice([0.0, 0.0, 60.0]),  # some reports stale
                waiting=rng.choice([None, 0.0, 0.0, 1.0, 6.0]),
                running=float(rng.choice([0, 1, 2, 3])),
                kv_usage=rng.choice([None, 0.1, 0.9]),
            )
            if rng.random() < 0.8
            else state(p)  # never reported
            for p in range(1, 9)
        )
        for s in states[: case % 3]:  # some endpoints' slots learned
            sched.latency.observe_load(s, EndpointMetrics(updated_at=NOW, waiting=1, running=2))
        snap = Snapshot(states, {s.address: rng.choice([0, 1, 2, 3]) for s in states})
        request = InferenceRequest("r", "m", "/")
        loop = sched.room(request, snap)
        sched.vectorize_from = 1
        assert sched.room(request, snap) == loop, case


@pytest.mark.parametrize("vectorize_from", [64, 1])  # the loop and the numpy columns
def test_the_load_bound_spills_a_hot_group_and_keeps_a_cold_one_home(vectorize_from: int) -> None:
    """With ``hotGroupShare``, a group carrying at least that share of one endpoint's
    fair share of the recent traffic is bounded by ``loadBound``; a smaller group by
    ``coldGroupLoadBound`` (0: not at all), so load swings do not move it."""
    states = [state(1), state(2), state(3), state(4)]
    hot = InferenceRequest("h", "m", "/", prompt="hot system prompt " * 60)
    cold = InferenceRequest("c", "m", "/", prompt="cold system prompt " * 60)
    scorer = prefix.prefix_cache_scorer(Params("t", {"hotGroupShare": 1}))  # cold: unbounded
    snap = Snapshot(tuple(states), {})
    for i in range(40):  # the hot group carries 7/8 of the traffic: 3.5 endpoints' worth
        req = cold if i % 8 == 0 else hot
        scorer.on_routed(req, SchedulingResult((states[0].endpoint,)), snap)

    def home_score(req: InferenceRequest) -> float:
        snapshot = Snapshot(tuple(states), {states[0].address: 9, states[1].address: 1})
        c = CycleContext(req, snapshot, NOW, random.Random(0))
        c.vectorize_from = vectorize_from
        return float(scorer.score(c, states)[0])

    assert home_score(hot) == 0.0  # 9 > 1.25 x mean(2.5) + 1: spill
    assert home_score(cold) == 1.0  # half of one endpoint's share: stays home
    everyone = prefix.prefix_cache_scorer(Params("t", {}))  # the default: all bounded
    for _ in range(4):
        everyone.on_routed(cold, SchedulingResult((states[0].endpoint,)), snap)
    c = CycleContext(cold, Snapshot(tuple(states), {states[0].address: 9}), NOW, random.Random(0))
    assert float(everyone.score(c, states)[0]) == 0.0


@pytest.mark.parametrize("vectorize_from", [64, 1])  # the loop and the numpy columns
def test_a_cold_group_leaves_its_home_only_when_the_home_is_full(vectorize_from: int) -> None:
    """With ``coldGroupKeepsFreeSlot``, a cold group's home above ``coldGroupLoadBound``
    keeps its prefix score while it has a free slot: in-flight below its slots where
    they are known, else no request waiting in the server's fresh report. A hot group
    is bounded as before."""
    hot = InferenceRequest("h", "m", "/", prompt="hot system prompt " * 60)
    cold = InferenceRequest("c", "m", "/", prompt="cold system prompt " * 60)
    params = {"hotGroupShare": 1, "coldGroupLoadBound": 1.25, "coldGroupKeepsFreeSlot": True}
    scorer = prefix.prefix_cache_scorer(Params("t", params))
    home = state(1)
    snap = Snapshot((home, state(2), state(3), state(4)), {})
    for i in range(40):  # the hot group carries 7/8 of the traffic, the cold one 1/8
        scorer.on_routed(cold if i % 8 == 0 else hot, SchedulingResult((home.endpoint,)), snap)

    def home_score(
        req: InferenceRequest,
        home_state: EndpointState,
        slots: int | None = None,
        plugin: prefix.PrefixCacheScorer = scorer,
    ) -> float:
        states = [home_state, state(2), state(3), state(4)]
        snapshot = Snapshot(tuple(states), {home_state.address: 9, states[1].address: 1})
        latency = LatencyModel(LatencyPriors(max_num_seqs=slots))
        c = CycleContext(req, snapshot, NOW, random.Random(0), latency=latency)
        c.vectorize_from = vectorize_from
        return float(plugin.score(c, states)[0])

    # 9 in flight > 1.25 x mean(2.5) + 1 on every line: only whether it is full differs
    assert home_score(cold, state(1, waiting=0.0, running=4.0)) == 1.0  # no queue: home
    assert home_score(cold, state(1, waiting=2.0, running=4.0)) == 0.0  # a queue: spill
    assert home_score(cold, state(1, age=60.0, waiting=0.0)) == 0.0  # stale: the bound
    assert home_score(cold, state(1)) == 0.0  # never reported: the bound alone
    assert home_score(cold, state(1, waiting=2.0), slots=16) == 1.0  # 9 of 16 slots
    assert home_score(cold, state(1, waiting=0.0), slots=8) == 0.0  # 9 >= 8 slots
    assert home_score(hot, state(1, waiting=0.0, running=4.0)) == 0.0  # hot: the bound
    off = prefix.prefix_cache_scorer(Params("t", {**params, "coldGroupKeepsFreeSlot": False}))
    for i in range(40):
        off.on_routed(cold if i % 8 == 0 else hot, SchedulingResult((home.endpoint,)), snap)
    # without it the cold group is held to coldGroupLoadBound alone
    assert home_score(cold, state(1, waiting=0.0, running=4.0), plugin=off) == 0.0
