"""Seeded chat workloads for routing benchmarks (pure: no I/O, no clock).

Three kinds (:data:`KINDS`, the ``kind`` of :func:`generate`), all streaming chat completions with
``stream_options.include_usage`` and an output length drawn per request:

* ``groups`` (the default): ``--groups`` groups of requests each share one long
  system prompt (distinct text per group, ``prefix_tokens`` tokens at the simulator's 4
  characters per token). A request is its group's system prompt plus its own user
  question (length drawn per request). Groups are drawn per request, uniformly or
  Zipf-skewed (``skew`` = the Zipf exponent, 0 = uniform).
* ``control``: the same lengths, but every request's system
  prompt is its own, so no two requests share even one prefix-cache block: prefix
  affinity cannot help, and least-request is the yardstick.
* ``multi-turn``: chat sessions. Each session belongs to a
  group (drawn as above) and opens with that group's system prompt; turn k sends every
  earlier turn's user message and assistant answer, then a new user message. The
  assistant answers are deterministic stand-ins as long as the answer asked for
  (``max_tokens``): the simulator's real answers differ, but what a router's cache
  affinity sees is the prompt prefix, which a session's turns share. Sessions start as a
  Poisson process; the time from one turn's arrival to the next is exponential with
  mean ``think_s``; every request carries its session in an ``x-session-id`` header.

Arrivals are Poisson: exponential inter-arrival times at ``rate`` per second (for
multi-turn, sessions at ``rate`` / mean turns, so requests arrive at about ``rate``).
Each request also says which earlier traffic would have left its prefix in a cache
(``TimedRequest.warm_prefixes``, ``marks``), for the routing benchmark's warm-miss count.

Everything comes from ``random.Random`` seeded explicitly: the system prompts from
``WorkloadSpec.prompt_seed`` (so every rate and every policy sees the same groups), the
arrivals, group choices, lengths and per-request texts from the ``seed`` given to the
generators.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

CHARS_PER_TOKEN = 4  # the simulator's tokenizer rule (epp_harness.sim.config.CHARS_PER_TOKEN)

_SYLLABLES = (
    "ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "ze", "pa", "qui", "dor", "fen", "gal",
    "hum", "jex", "bri", "cos", "tal", "wen", "yor", "xil", "mun", "pel", "sor", "tup",
)  # fmt: skip


@dataclass(frozen=True)
class WorkloadSpec:
    """The shape of the workload; the same spec gives the same system prompts."""

    model: str = "sim-model"
    groups: int = 16
    prefix_tokens: int = 1500
    question_tokens: tuple[int, int] = (20, 200)  # inclusive range, drawn uniformly
    output_tokens: tuple[int, int] = (10, 100)  # inclusive range, drawn uniformly
    skew: float = 0.0  # Zipf exponent over groups; 0 = uniform
    prompt_seed: int = 0
    # multi-turn only: turns per session (inclusive range, uniform) and the mean time
    # from one turn's arrival to the next (exponential)
    turns: tuple[int, int] = (2, 6)
    think_s: float = 3.0

    def __post_init__(self) -> None:
        if self.groups < 1:
            raise ValueError("groups must be >= 1")
        if self.prefix_tokens < 1:
            raise ValueError("prefix_tokens must be >= 1")
        for name in ("question_tokens", "output_tokens", "turns"):
            lo, hi = getattr(self, name)
            if not 1 <= lo <= hi:
                raise ValueError(f"{name} must be a range 1 <= lo <= hi, got {(lo, hi)}")
        if not self.skew >= 0:
            raise ValueError("skew must be >= 0")
        if not self.think_s > 0:
            raise ValueError("think_s must be > 0")


Kind = Literal["groups", "control", "multi-turn"]
KINDS: tuple[Kind, ...] = ("groups", "control", "multi-turn")
SESSION_HEADER = "x-session-id"


class TimedRequest(NamedTuple):
    """One request of the schedule: when to send it (seconds after the start) and what.

    ``group`` is the request's prefix group (control: the request's own index, as no
    two requests share a prompt). ``warm_prefixes`` lists, longest first, (key, chars):
    once some earlier request that ``marks`` key has been prefilled, this request's
    first ``chars`` prompt characters (its messages' contents concatenated) were
    computed before, so a cache on the same server could serve them. ``marks``: the
    keys this request's own prefill makes warm.
    """

    offset_s: float
    body: dict[str, Any]
    group: int
    headers: tuple[tuple[str, str], ...] = ()
    warm_prefixes: tuple[tuple[str, int], ...] = ()
    marks: tuple[str, ...] = ()


def text_of_length(rng: random.Random, chars: int, head: str = "") -> str:
    """``head`` followed by pseudo-words from ``rng``, exactly ``chars`` characters long."""
    parts = [head] if head else []
    size = len(head)
    while size < chars:
        word = "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 3)))
        parts.append(word + " ")
        size += len(word) + 1
    return "".join(parts)[:chars]


def system_prompts(spec: WorkloadSpec) -> list[str]:
    """One system prompt per group, each ``prefix_tokens`` tokens, distinct from the
    first characters on (so no two groups share even one prefix-cache block)."""
    rng = random.Random(f"system-prompts/{spec.prompt_seed}")
    chars = spec.prefix_tokens * CHARS_PER_TOKEN
    return [
        text_of_length(rng, chars, head=f"[group {g}] You are assistant number {g}. ")
        for g in range(spec.groups)
    ]


def group_weights(groups: int, skew: float) -> list[float]:
    """Zipf weights 1/(rank+1)^skew, normalised; uniform when ``skew`` is 0."""
    raw = [1.0 / (g + 1) ** skew for g in range(groups)]
    total = sum(raw)
    return [w / total for w in raw]


def arrival_offsets(rng: random.Random, rate: float, duration: float) -> list[float]:
    """Poisson arrivals: cumulative exponential gaps at ``rate``/s, all < ``duration``."""
    if not rate > 0:
        raise ValueError("rate must be > 0")
    offsets: list[float] = []
    t = rng.expovariate(rate)
    while t < duration:
        offsets.append(t)
        t += rng.expovariate(rate)
    return offsets


def _body(spec: WorkloadSpec, messages: list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
    return {
        "model": spec.model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def group_key(group: int) -> str:
    return f"group {group}"


class _Window(NamedTuple):
    rate: float
    duration: float
    seed: int


def generate(
    spec: WorkloadSpec,
    rate: float,
    duration: float,
    seed: int,
    prompts: list[str] | None = None,
    kind: Kind = "groups",
) -> list[TimedRequest]:
    """The requests of workload ``kind`` arriving in ``[0, duration)`` at about ``rate``
    per second, in arrival order. ``prompts`` lets callers pass :func:`system_prompts`
    (spec) once instead of rebuilding it for every call.
    """
    prompts = system_prompts(spec) if prompts is None else prompts
    if len(prompts) != spec.groups:
        raise ValueError("prompts must hold one system prompt per group")
    window = _Window(rate, duration, seed)
    if kind == "groups":
        return _groups(spec, window, prompts)
    if kind == "control":
        return _control(spec, window)
    if kind == "multi-turn":
        return _multi_turn(spec, window, prompts)
    raise ValueError(f"unknown workload kind {kind!r}")


def _groups(spec: WorkloadSpec, w: _Window, prompts: list[str]) -> list[TimedRequest]:
    """``messages`` = [system prompt of the request's group, user question]."""
    rng = random.Random(f"requests/{w.seed}")
    weights = group_weights(spec.groups, spec.skew)
    population = range(spec.groups)
    out: list[TimedRequest] = []
    for i, offset in enumerate(arrival_offsets(rng, w.rate, w.duration)):
        group = rng.choices(population, weights)[0]
        question_chars = rng.randint(*spec.question_tokens) * CHARS_PER_TOKEN
        question = text_of_length(rng, question_chars, head=f"Question {i}: ")
        messages = [
            {"role": "system", "content": prompts[group]},
            {"role": "user", "content": question},
        ]
        key = group_key(group)
        out.append(
            TimedRequest(
                offset,
                _body(spec, messages, rng.randint(*spec.output_tokens)),
                group,
                warm_prefixes=((key, len(prompts[group])),),
                marks=(key,),
            )
        )
    return out


def _control(spec: WorkloadSpec, w: _Window) -> list[TimedRequest]:
    """As ``groups``, but each request's system prompt (``prefix_tokens`` long) is its
    own, distinct from the first characters on: nothing is ever shared."""
    rng = random.Random(f"control/{w.seed}")
    chars = spec.prefix_tokens * CHARS_PER_TOKEN
    out: list[TimedRequest] = []
    for i, offset in enumerate(arrival_offsets(rng, w.rate, w.duration)):
        system = text_of_length(rng, chars, head=f"[request {w.seed}/{i}] You are unique. ")
        question_chars = rng.randint(*spec.question_tokens) * CHARS_PER_TOKEN
        question = text_of_length(rng, question_chars, head=f"Question {i}: ")
        messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
        out.append(TimedRequest(offset, _body(spec, messages, rng.randint(*spec.output_tokens)), i))
    return out


def answer_text(session: str, turn: int, tokens: int) -> str:
    """The stand-in assistant answer of a session's turn: ``tokens`` tokens of text."""
    rng = random.Random(f"answer/{session}/{turn}")
    return text_of_length(rng, tokens * CHARS_PER_TOKEN, head=f"Answer {turn}: ")


def _multi_turn(spec: WorkloadSpec, w: _Window, prompts: list[str]) -> list[TimedRequest]:
    """Chat sessions' turns. Sessions start at ``rate`` / (mean turns) per second, from
    one mean session length before 0 on (turns before 0 are not sent), so the request
    rate is steady from the start. Session ids (``x-session-id``) are ``{seed}-{n}``:
    distinct across cells.
    """
    rng = random.Random(f"sessions/{w.seed}")
    weights = group_weights(spec.groups, spec.skew)
    mean_turns = (spec.turns[0] + spec.turns[1]) / 2
    lead = (mean_turns - 1) * spec.think_s
    out: list[TimedRequest] = []
    starts = arrival_offsets(rng, w.rate / mean_turns, w.duration + lead)
    for n, start in enumerate(starts):
        session = f"{w.seed}-{n}"
        group = rng.choices(range(spec.groups), weights)[0]
        messages = [{"role": "system", "content": prompts[group]}]
        offset = start - lead
        previous: tuple[tuple[str, int], ...] = ()
        for turn in range(1, rng.randint(*spec.turns) + 1):
            if turn > 1:
                offset += rng.expovariate(1 / spec.think_s)
            question_chars = rng.randint(*spec.question_tokens) * CHARS_PER_TOKEN
            head = f"Session {session} turn {turn}: "
            messages.append({"role": "user", "content": text_of_length(rng, question_chars, head)})
            max_tokens = rng.randint(*spec.output_tokens)
            key = f"session {session} turn {turn}"
            if 0 <= offset < w.duration:
                out.append(
                    TimedRequest(
                        offset,
                        _body(spec, list(messages), max_tokens),
                        group,
                        headers=((SESSION_HEADER, session),),
                        warm_prefixes=(*previous, (group_key(group), len(prompts[group]))),
                        marks=(group_key(group), key),
                    )
                )
            previous = ((key, sum(len(m["content"]) for m in messages)),)
            messages.append(
                {"role": "assistant", "content": answer_text(session, turn, max_tokens)}
            )
    out.sort(key=lambda r: r.offset_s)
    return out
