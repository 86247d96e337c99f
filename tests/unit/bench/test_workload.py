"""bench/workload.py: the seeded workloads of the routing benchmark (groups, control,
multi-turn)."""

from __future__ import annotations

import itertools
import random
from collections import Counter

import pytest

from bench.workload import (
    CHARS_PER_TOKEN,
    KINDS,
    SESSION_HEADER,
    TimedRequest,
    WorkloadSpec,
    arrival_offsets,
    generate,
    group_key,
    group_weights,
    system_prompts,
)

SPEC = WorkloadSpec(groups=8, prefix_tokens=300, question_tokens=(20, 200), output_tokens=(10, 100))


def test_same_seed_same_requests_other_seed_others() -> None:
    a = generate(SPEC, rate=20, duration=10, seed=1)
    assert a == generate(SPEC, rate=20, duration=10, seed=1)
    b = generate(SPEC, rate=20, duration=10, seed=2)
    assert [r.offset_s for r in a] != [r.offset_s for r in b]
    assert [r.body for r in a] != [r.body for r in b]


def test_prompts_depend_on_prompt_seed_only() -> None:
    assert system_prompts(SPEC) == system_prompts(WorkloadSpec(**{**SPEC.__dict__}))
    other = WorkloadSpec(**{**SPEC.__dict__, "prompt_seed": 1})
    assert system_prompts(SPEC) != system_prompts(other)
    # The per-request seed does not change the groups' prompts.
    systems = {r.body["messages"][0]["content"] for s in (1, 2) for r in generate(SPEC, 30, 5, s)}
    assert systems <= set(system_prompts(SPEC))


def test_shared_prefix_within_a_group_distinct_across_groups() -> None:
    requests = generate(SPEC, rate=50, duration=10, seed=3)
    prompts = system_prompts(SPEC)
    by_group: dict[int, set[str]] = {}
    for r in requests:
        system, user = r.body["messages"]
        assert (system["role"], user["role"]) == ("system", "user")
        by_group.setdefault(r.group, set()).add(system["content"])
    assert set(by_group) == set(range(SPEC.groups))  # 500 requests reach every group
    for group, systems in by_group.items():
        assert systems == {prompts[group]}
    # Distinct from the first prefix-cache block on (64 characters = one 16-token block).
    assert len({p[:64] for p in prompts}) == SPEC.groups
    assert all(len(p) == SPEC.prefix_tokens * CHARS_PER_TOKEN for p in prompts)


def test_lengths_within_bounds_and_bodies_stream() -> None:
    requests = generate(SPEC, rate=50, duration=10, seed=4)
    lo_q, hi_q = SPEC.question_tokens
    lo_o, hi_o = SPEC.output_tokens
    questions = [len(r.body["messages"][1]["content"]) for r in requests]
    outputs = [r.body["max_tokens"] for r in requests]
    assert all(lo_q * CHARS_PER_TOKEN <= q <= hi_q * CHARS_PER_TOKEN for q in questions)
    assert all(lo_o <= o <= hi_o for o in outputs)
    assert min(outputs) < lo_o + 10 and max(outputs) > hi_o - 10  # drawn across the range
    for r in requests:
        assert r.body["stream"] is True
        assert r.body["stream_options"] == {"include_usage": True}
        assert r.body["model"] == SPEC.model


@pytest.mark.parametrize("rate", [5.0, 40.0])
def test_poisson_arrivals_mean_rate_and_exponential_gaps(rate: float) -> None:
    duration = 2000 / rate  # ~2000 arrivals
    offsets = arrival_offsets(random.Random(7), rate, duration)
    assert offsets == sorted(offsets)
    assert offsets[0] >= 0 and offsets[-1] < duration
    assert len(offsets) / duration == pytest.approx(rate, rel=0.08)  # sd ~2.2 %
    gaps = [b - a for a, b in itertools.pairwise(offsets)]
    mean = sum(gaps) / len(gaps)
    # Exponential: the standard deviation equals the mean (a fixed interval would give 0).
    sd = (sum((g - mean) ** 2 for g in gaps) / len(gaps)) ** 0.5
    assert sd == pytest.approx(mean, rel=0.1)


def test_requests_ordered_and_inside_duration() -> None:
    requests = generate(SPEC, rate=30, duration=5, seed=5)
    offsets = [r.offset_s for r in requests]
    assert offsets == sorted(offsets) and all(0 <= o < 5 for o in offsets)


def test_uniform_groups_by_default_and_skew_favours_first_groups() -> None:
    uniform = Counter(r.group for r in generate(SPEC, rate=100, duration=40, seed=6))
    expected = sum(uniform.values()) / SPEC.groups
    assert all(abs(n - expected) < 0.2 * expected for n in uniform.values())
    skewed_spec = WorkloadSpec(**{**SPEC.__dict__, "skew": 1.2})
    skewed = Counter(r.group for r in generate(skewed_spec, rate=100, duration=40, seed=6))
    assert skewed[0] > 3 * skewed[SPEC.groups - 1]
    assert group_weights(4, 0.0) == [0.25] * 4
    assert sum(group_weights(16, 1.0)) == pytest.approx(1.0)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"groups": 0},
        {"prefix_tokens": 0},
        {"question_tokens": (0, 5)},
        {"output_tokens": (10, 5)},
        {"skew": -1.0},
        {"turns": (0, 3)},
        {"think_s": 0.0},
    ],
)
def test_spec_rejects_nonsense(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        WorkloadSpec(**kwargs)  # type: ignore[arg-type]


def test_control_prompts_share_nothing_and_keep_the_lengths() -> None:
    requests = generate(SPEC, rate=50, duration=10, seed=8, kind="control")
    assert requests == generate(SPEC, rate=50, duration=10, seed=8, kind="control")
    systems = [r.body["messages"][0]["content"] for r in requests]
    assert all(len(s) == SPEC.prefix_tokens * CHARS_PER_TOKEN for s in systems)
    assert len({s[:64] for s in systems}) == len(systems)  # distinct from the first block
    other = generate(SPEC, rate=50, duration=10, seed=9, kind="control")  # the next cell's
    assert not {s[:64] for s in systems} & {r.body["messages"][0]["content"][:64] for r in other}
    assert [r.group for r in requests] == list(range(len(requests)))
    assert all(r.warm_prefixes == () and r.marks == () for r in requests)
    lo, hi = SPEC.question_tokens
    assert all(
        lo * CHARS_PER_TOKEN <= len(r.body["messages"][1]["content"]) <= hi * CHARS_PER_TOKEN
        for r in requests
    )


def test_groups_requests_mark_and_expect_their_system_prompt() -> None:
    prompts = system_prompts(SPEC)
    for r in generate(SPEC, rate=20, duration=2, seed=1):
        assert r.warm_prefixes == ((group_key(r.group), len(prompts[r.group])),)
        assert r.marks == (group_key(r.group),)


MULTI = WorkloadSpec(
    groups=4, prefix_tokens=100, question_tokens=(5, 10), output_tokens=(3, 6), turns=(2, 4)
)


def sessions_of(requests: list[TimedRequest]) -> dict[str, list[TimedRequest]]:
    out: dict[str, list[TimedRequest]] = {}
    for r in requests:
        ((name, session),) = r.headers
        assert name == SESSION_HEADER
        out.setdefault(session, []).append(r)
    return out


def test_multi_turn_turns_extend_the_conversation() -> None:
    requests = generate(MULTI, rate=10, duration=60, seed=3, kind="multi-turn")
    assert requests == generate(MULTI, rate=10, duration=60, seed=3, kind="multi-turn")
    offsets = [r.offset_s for r in requests]
    assert offsets == sorted(offsets) and all(0 <= o < 60 for o in offsets)
    prompts = system_prompts(MULTI)
    sessions = sessions_of(requests)
    complete = 0
    for session, turns in sessions.items():
        assert len({r.group for r in turns}) == 1
        group = turns[0].group
        for earlier, later in itertools.pairwise(turns):
            before, after = earlier.body["messages"], later.body["messages"]
            # everything sent before, the stand-in answer of that turn's length, a new question
            assert after[: len(before)] == before
            assert [m["role"] for m in after[len(before) :]] == ["assistant", "user"]
            answer = after[len(before)]["content"]
            assert len(answer) == earlier.body["max_tokens"] * CHARS_PER_TOKEN
            prior = sum(len(m["content"]) for m in before)
            assert later.warm_prefixes[0] == (earlier.marks[1], prior)
        for r in turns:
            messages = r.body["messages"]
            assert messages[0] == {"role": "system", "content": prompts[group]}
            assert messages[-1]["role"] == "user"
            assert r.warm_prefixes[-1] == (group_key(group), len(prompts[group]))
            assert r.marks[0] == group_key(group) and session in r.marks[1]
        first_turn = len(turns[0].body["messages"]) == 2
        complete += first_turn
        if first_turn:
            assert turns[0].warm_prefixes == ((group_key(group), len(prompts[group])),)
    assert complete > 50  # most sessions start inside the window
    # sessions start before 0 too: some are already under way (their first turn unsent)
    assert complete < len(sessions)


def test_multi_turn_rate_is_about_the_request_rate_and_sessions_are_distinct() -> None:
    requests = generate(MULTI, rate=20, duration=200, seed=4, kind="multi-turn")
    assert len(requests) / 200 == pytest.approx(20, rel=0.1)
    other = generate(MULTI, rate=20, duration=200, seed=5, kind="multi-turn")
    assert not set(sessions_of(requests)) & set(sessions_of(other))
    turns = Counter(len(t) for t in sessions_of(requests).values())
    assert set(turns) <= {1, 2, 3, 4}


def test_unknown_kind_is_refused() -> None:
    assert KINDS == ("groups", "control", "multi-turn")
    with pytest.raises(ValueError):
        generate(SPEC, 10, 5, 1, kind="other")  # type: ignore[arg-type]
