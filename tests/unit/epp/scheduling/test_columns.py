"""The numpy path of scheduling (many candidates) against the list path (few): the same
scores, totals and picks, plus the columnar views it reads."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from epp.common.params import Params
from epp.config import build_scheduler, builtin_registry
from epp.scheduling.base import CycleContext
from epp.scheduling.columns import Columns, FloatArray, candidate_view, snapshot_columns
from epp.scheduling.latency import LatencyModel, LatencyPriors
from epp.scheduling.plugins import filters, pickers, prefix
from epp.scheduling.profile import Profile, WeightedScorer, clamped
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
LISTS = 10**9  # vectorize_from: never numpy
NUMPY = 1  # vectorize_from: always numpy


def state(port: int, role: Role = Role.DECODE, age: float = 0.0, **m: object) -> EndpointState:
    metrics = EndpointMetrics(updated_at=NOW - age, **m) if m else None  # type: ignore[arg-type]
    return EndpointState(Endpoint("10.0.0.1", port, role), metrics)


def ctx(snap: Snapshot, vectorize_from: int, prompt: str = "") -> CycleContext:
    req = InferenceRequest("r", "m", "/v1/completions", prompt=prompt)
    return CycleContext(req, snap, NOW, random.Random(0), 2.0, {}, vectorize_from)


def unit(scores: Sequence[float] | FloatArray) -> list[float]:
    """What the profile weighs: scores clamped to [0, 1], NaN -> 0."""
    return clamped(scores, len(scores), "test").tolist()


maybe = st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True, width=32))
endpoint_specs = st.lists(
    st.tuples(
        st.booleans(),  # reported at all
        maybe,  # waiting
        maybe,  # running
        maybe,  # kv_usage
        st.floats(0, 5),  # age: > 2 s is stale
        st.integers(0, 50),  # in flight
        st.sampled_from(list(Role)),
    ),
    min_size=1,
    max_size=12,
)


def pool(
    specs: list[tuple[bool, float | None, float | None, float | None, float, int, Role]],
) -> Snapshot:
    states = tuple(
        state(i + 1, role, age, waiting=w, running=r, kv_usage=kv)
        if reported
        else state(i + 1, role)
        for i, (reported, w, r, kv, age, _, role) in enumerate(specs)
    )
    flight = {s.address: n for s, (*_, n, _) in zip(states, specs, strict=True)}
    tokens = {s.address: 7 * n for s, (*_, n, _) in zip(states, specs, strict=True)}
    return Snapshot(states, flight, tokens)


SCORERS = [
    ("queue-scorer", {}),
    ("queue-scorer", {"normalize": "threshold", "threshold": 3}),
    ("running-requests-scorer", {}),
    ("kv-cache-utilization-scorer", {}),
    ("in-flight-load-scorer", {}),
    ("in-flight-load-scorer", {"unit": "tokens"}),
    ("prefix-cache-scorer", {"blockSize": 1}),
    ("prefix-cache-scorer", {"blockSize": 1, "loadBound": 1.1}),
]


def hold_some_prefix(
    scorer: prefix.PrefixCacheScorer, snap: Snapshot, prompt: str, data: st.DataObject
) -> None:
    """Each endpoint is routed a drawn leading part of ``prompt`` (possibly none)."""
    for s in snap.endpoints:
        cut = data.draw(st.integers(0, len(prompt)))
        req = InferenceRequest("r", "m", "/", prompt=prompt[:cut])
        scorer.on_routed(req, SchedulingResult((s.endpoint,)), snap)


@given(endpoint_specs, st.text(alphabet="ab", max_size=40), st.data())
@settings(max_examples=150)
def test_builtin_scorers_give_the_same_scores_with_numpy(
    specs: list[tuple[bool, float | None, float | None, float | None, float, int, Role]],
    prompt: str,
    data: st.DataObject,
) -> None:
    snap = pool(specs)
    registry = builtin_registry()
    for name, params in SCORERS:
        scorer = registry.get(name, "test").factory(Params(name, params))
        if isinstance(scorer, prefix.PrefixCacheScorer):
            hold_some_prefix(scorer, snap, prompt, data)
        candidates = data.draw(st.sampled_from([snap.endpoints, list(snap.endpoints[::2])]))
        lists = scorer.score(ctx(snap, LISTS, prompt), candidates)
        arrays = scorer.score(ctx(snap, NUMPY, prompt), candidates)
        assert isinstance(lists, list)
        assert unit(arrays) == unit(lists), (name, params)


@given(endpoint_specs, st.text(alphabet="ab", max_size=600), st.integers())
@settings(max_examples=100)
def test_the_scheduler_picks_the_same_with_numpy(
    specs: list[tuple[bool, float | None, float | None, float | None, float, int, Role]],
    prompt: str,
    seed: int,
) -> None:
    """Same targets and the same random draws (ties included), request after request."""
    snap = pool(specs)
    results = []
    for vectorize_from in (LISTS, NUMPY):
        sched = build_scheduler("{}", clock=lambda: NOW)
        sched.vectorize_from = vectorize_from
        rng = random.Random(seed)
        picks = []
        for i in range(4):
            req = InferenceRequest(str(i), "m", "/v1/completions", prompt=prompt[: 150 * (i + 1)])
            try:
                result = sched.schedule(req, snap, rng)
            except Exception as exc:
                picks.append(type(exc).__name__)
                continue
            sched.on_routed(req, result, snap)
            picks.append(result)
        results.append((picks, rng.random()))
    assert results[0] == results[1]


@given(st.lists(st.integers(0, 3), min_size=0, max_size=15), st.integers(1, 4), st.integers())
def test_max_score_picker_with_an_array_picks_like_the_list(
    scores: list[int], k: int, seed: int
) -> None:
    states = [state(i + 1) for i in range(len(scores))]
    picker = pickers.max_score_picker(Params("t", {"maxTargets": k}))
    c = ctx(Snapshot(tuple(states), {}), NUMPY)
    c.rng = random.Random(seed)
    from_list = picker.pick(c, list(zip(states, map(float, scores), strict=True)))
    after_list = c.rng.random()
    c.rng = random.Random(seed)
    from_array = picker.pick_scores(c, states, np.array(scores, np.float64))
    assert from_array == from_list and c.rng.random() == after_list


class ListScorer:
    """A third-party scorer written against the list contract (out of range, NaN)."""

    def score(self, ctx: CycleContext, candidates: Sequence[EndpointState]) -> list[float]:
        return [[2.0, -1.0, math.nan, 0.25][i % 4] for i in range(len(candidates))]


class ArrayScorer:
    def score(self, ctx: CycleContext, candidates: Sequence[EndpointState]) -> FloatArray:
        return np.array(
            [[math.inf, -math.inf, math.nan, 0.5][i % 4] for i in range(len(candidates))]
        )


class ShortScorer:
    def __init__(self, array: bool) -> None:
        self.array = array

    def score(
        self, ctx: CycleContext, candidates: Sequence[EndpointState]
    ) -> list[float] | FloatArray:
        scores = [0.5] * (len(candidates) - 1)
        return np.array(scores) if self.array else scores


class RecordingPicker:
    """A third-party picker (no pick_scores): sees (state, total) pairs."""

    def __init__(self) -> None:
        self.seen: list[tuple[EndpointState, float]] = []

    def pick(
        self, ctx: CycleContext, scored: Sequence[tuple[EndpointState, float]]
    ) -> list[EndpointState]:
        self.seen = list(scored)
        return [scored[0][0]]


def test_third_party_list_and_array_scorers_are_clamped_alike_in_both_paths() -> None:
    states = tuple(state(i + 1) for i in range(4))
    totals = []
    for vectorize_from in (LISTS, NUMPY):
        picker = RecordingPicker()
        scorers = (WeightedScorer("l", ListScorer(), 1.0), WeightedScorer("a", ArrayScorer(), 2.0))
        Profile("p", (), scorers, picker).run(ctx(Snapshot(states, {}), vectorize_from), states)
        assert [s for s, _ in picker.seen] == list(states)
        totals.append([t for _, t in picker.seen])
    assert totals[0] == totals[1] == [1.0 + 2.0, 0.0, 0.0, 0.25 + 1.0]


@pytest.mark.parametrize("vectorize_from", [LISTS, NUMPY])
@pytest.mark.parametrize("array", [False, True])
def test_a_scorer_with_too_few_scores_is_an_error(vectorize_from: int, array: bool) -> None:
    states = tuple(state(i + 1) for i in range(3))
    profile = Profile(
        "p", (), (WeightedScorer("short", ShortScorer(array), 1.0),), RecordingPicker()
    )
    with pytest.raises(ValueError):
        profile.run(ctx(Snapshot(states, {}), vectorize_from), states)


def test_columns_mark_stale_unreported_and_missing_metrics_unknown() -> None:
    states = (
        state(1, waiting=3, kv_usage=0.5),
        state(2, age=5.0, waiting=1, kv_usage=0.1),  # stale
        state(3, running=2),  # waiting not reported
        state(4),  # never reported
    )
    snap = Snapshot(states, {states[0].address: 4})
    view = ctx(snap, NUMPY).view(states)
    assert view.fresh().tolist() == [True, False, True, False]
    waiting = view.metric("waiting")
    assert waiting[0] == 3.0 and np.isnan(waiting[1:]).all()
    assert view.counts(snap.in_flight).tolist() == [4.0, 0.0, 0.0, 0.0]
    assert view.by_address({states[2].address: 0.5, "9.9.9.9:1": 1.0}).tolist() == [
        0.0,
        0.0,
        0.5,
        0.0,
    ]
    with pytest.raises(ValueError):  # shared by every scorer of the cycle: read-only
        waiting[0] = 1.0


def test_columns_are_built_once_per_snapshot_and_candidates_map_onto_them() -> None:
    states = tuple(state(i + 1, waiting=i) for i in range(5))
    snap = Snapshot(states, {})
    assert snapshot_columns(snap) is snapshot_columns(snap)
    assert snapshot_columns(Snapshot(states, {})) is not snapshot_columns(snap)
    subset = [states[4], states[1]]
    view = candidate_view(snap, subset, NOW - 2.0)
    assert view.columns is snapshot_columns(snap) and view.rows.tolist() == [4, 1]
    assert view.metric("waiting").tolist() == [4.0, 1.0]
    stranger = [state(9, waiting=7), states[0]]  # not the snapshot's: columns of its own
    other = candidate_view(snap, stranger, NOW - 2.0)
    assert other.columns is not snapshot_columns(snap)
    assert other.metric("waiting").tolist() == [7.0, 0.0]
    for _ in range(100):  # a filter returning a new tuple each cycle
        candidate_view(snap, tuple(states[:3]), NOW - 2.0)
    assert len(snap.derived["rows"]) <= 16


def test_role_filter_uses_the_role_column_once_per_snapshot() -> None:
    states = (state(1, Role.PREFILL), state(2), state(3, Role.BOTH))
    snap = Snapshot(states, {})
    decode = filters.decode_filter(Params("t", {}))
    small = decode.filter(ctx(snap, LISTS), snap.endpoints)  # few candidates: a list
    kept = decode.filter(ctx(snap, NUMPY), snap.endpoints)
    assert list(kept) == list(small) == [states[1], states[2]]
    assert decode.filter(ctx(snap, NUMPY), snap.endpoints) is kept  # once per snapshot
    view = ctx(snap, NUMPY).view(kept)  # its rows are known without a lookup
    assert view.rows.tolist() == [1, 2] and view.addresses == (states[1].address, states[2].address)
    assert decode.filter(ctx(snap, NUMPY), list(states[:2])) == [states[1]]
    everyone = Snapshot(states[1:], {})  # all pass: the snapshot's own tuple
    assert decode.filter(ctx(everyone, NUMPY), everyone.endpoints) is everyone.endpoints
    changed = Snapshot(
        (states[0], EndpointState(Endpoint("10.0.0.1", 2, Role.PREFILL)), states[2]), {}
    )
    assert decode.filter(ctx(changed, NUMPY), changed.endpoints) == (
        states[2],
    )  # role column follows


def test_snapshot_state_without_a_live_index_finds_the_first_endpoint() -> None:
    first, second = state(1), EndpointState(Endpoint("10.0.0.1", 1, Role.PREFILL))
    snap = Snapshot((first, second, state(2)), {})
    assert snap.state(first.address) is first
    assert snap.state("10.0.0.1:2") is snap.endpoints[2]
    assert snap.state("10.0.0.1:3") is None


def test_both_paths_score_every_endpoint_of_a_repeated_address_alike() -> None:
    """The datastore never repeats an address; a hand-built snapshot may, and the
    numpy path must then give each such row the address's value, as the list path."""
    first, again = state(1, waiting=0), state(1, waiting=9)
    snap = Snapshot((first, again, state(2)), {})
    scorer = prefix.prefix_cache_scorer(Params("test", {"loadBound": 0}))
    prompt = "shared system prompt " * 200
    req = ctx(snap, LISTS, prompt=prompt).request
    scorer.on_routed(req, SchedulingResult((first.endpoint,)), snap)  # the address holds it
    listed = scorer.score(ctx(snap, LISTS, prompt=prompt), snap.endpoints)
    vectored = scorer.score(ctx(snap, NUMPY, prompt=prompt), snap.endpoints)
    assert list(listed) == [1.0, 1.0, 0.0]
    assert list(np.asarray(vectored, np.float64)) == list(listed)


@given(
    st.lists(st.tuples(st.booleans(), maybe, st.booleans()), min_size=1, max_size=12),
    st.booleans(),
)
def test_a_successor_snapshots_columns_equal_columns_built_from_scratch(
    changes: list[tuple[bool, float | None, bool]], renamed: bool
) -> None:
    """The next snapshot's columns start from the last ones; rows of replaced states
    (new metrics, dropped metrics, another endpoint) must be rebuilt."""
    before = tuple(state(i + 1, waiting=i, kv_usage=0.5) for i in range(len(changes)))
    after = tuple(
        s
        if not change
        else (
            state(s.endpoint.port + 100 * renamed, waiting=w)
            if keep
            else state(s.endpoint.port, Role.PREFILL)
        )
        for s, (change, w, keep) in zip(before, changes, strict=True)
    )
    first = snapshot_columns(Snapshot(before, {}))
    successor = first.successor(after)
    scratch = Columns.build(after)
    assert np.array_equal(successor.updated_at, scratch.updated_at)
    for name, column in scratch.fields.items():
        assert np.array_equal(successor.fields[name], column, equal_nan=True), name
    assert dict(successor.row_of_state) == dict(scratch.row_of_state)
    assert dict(successor.row_of_address) == dict(scratch.row_of_address)
    assert successor.addresses == scratch.addresses
    assert successor.roles.tolist() == scratch.roles.tolist()


def test_each_pool_starts_its_next_columns_from_its_own_last_ones() -> None:
    """Two pools (live indexes) alternating: each new snapshot reuses its own pool's
    columns (shared address rows), never the other pool's."""
    a_states = tuple(state(i, waiting=i) for i in range(1, 5))
    b_states = tuple(state(i + 10, waiting=i) for i in range(1, 5))
    a_live = {s.address: s for s in a_states}
    b_live = {s.address: s for s in b_states}
    a1 = snapshot_columns(Snapshot(a_states, {}, by_address=a_live))
    b1 = snapshot_columns(Snapshot(b_states, {}, by_address=b_live))
    a2_states = (state(1, waiting=7), *a_states[1:])
    a2 = snapshot_columns(Snapshot(a2_states, {}, by_address=a_live))
    b2 = snapshot_columns(Snapshot((*b_states[:3], state(14, waiting=0)), {}, by_address=b_live))
    assert a2.row_of_address is a1.row_of_address  # a successor, not a rebuild
    assert b2.row_of_address is b1.row_of_address
    assert a2.fields["waiting"].tolist() == [7, 2, 3, 4]
    assert b2.fields["waiting"].tolist() == [1, 2, 3, 0]


@given(endpoint_specs, st.text(alphabet="ab", max_size=200), st.data())
@settings(max_examples=150)
def test_the_latency_scorer_gives_the_same_scores_with_numpy(
    specs: list[tuple[bool, float | None, float | None, float | None, float, int, Role]],
    prompt: str,
    data: st.DataObject,
) -> None:
    """Predictions from the learned columns equal the per-endpoint ones, with slots
    known, learned or unknown, small prefix LRUs (eviction costs), group homes or none,
    SLOs or none."""
    snap = pool(specs)
    registry = builtin_registry()
    index = prefix.prefix_cache_scorer(Params("p", {"blockSize": 1, "lruCapacityPerServer": 64}))
    hold_some_prefix(index, snap, prompt, data)
    scorer = registry.get("predicted-latency-scorer", "t").factory(
        Params(
            "t",
            {
                "evictionWeight": data.draw(st.sampled_from([0.0, 0.5])),
                "homeShare": data.draw(st.sampled_from([0.0, 0.5, 4.0])),
            },
        )
    )
    scorer.bind({"prefix-cache-scorer": index}, [])
    slots = data.draw(st.sampled_from([None, 1, 4]))
    model = LatencyModel(LatencyPriors(max_num_seqs=slots))
    for s in snap.endpoints:  # some endpoints learned their slots from a queue seen
        if data.draw(st.booleans()):
            model.observe_load(s, EndpointMetrics(NOW, waiting=1.0, running=2.0))
        if data.draw(st.booleans()):  # a request seen ending, before or after its report
            model.request_done(s.address, NOW - data.draw(st.floats(0, 5)))
    slo = data.draw(st.sampled_from([None, 1.0, 50.0, 1e6]))
    slo_tpot = data.draw(st.sampled_from([None, 20.6, 21.0]))
    candidates = data.draw(st.sampled_from([snap.endpoints, list(snap.endpoints[::2])]))
    scores = []
    for vectorize_from in (LISTS, NUMPY):
        req = InferenceRequest(
            "r", "m", "/v1/completions", prompt=prompt, slo_ttft_ms=slo, slo_tpot_ms=slo_tpot
        )
        c = CycleContext(req, snap, NOW, random.Random(0), 2.0, {}, vectorize_from, model)
        scores.append(unit(scorer.score(c, candidates)))
    assert scores[0] == pytest.approx(scores[1], rel=1e-9, abs=1e-12)


def test_reported_slots_of_endpoints_the_model_meets_for_the_first_time() -> None:
    # more new endpoints than the model's columns hold: finding their rows grows them
    model = LatencyModel()
    states = tuple(state(i + 1) for i in range(40))
    view = candidate_view(Snapshot(states, {}), states, NOW - 2.0)
    assert model.reported_slots_view(view).tolist() == [0.0] * 40  # none reported yet
