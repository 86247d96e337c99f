"""A seeded shared-prefix chat workload for routing benchmarks (pure: no I/O, no clock).

``--groups`` groups of requests each share one long system prompt (distinct text per
group, ``prefix_tokens`` tokens at the simulator's 4 characters per token). A request is
its group's system prompt plus its own user question (length drawn per request), sent
as a streaming chat completion with an output length drawn per request. Groups are
drawn per request, uniformly or Zipf-skewed (``skew`` = the Zipf exponent, 0 = uniform).
Arrivals are a Poisson process: exponential inter-arrival times at ``rate`` per second.

Everything comes from ``random.Random`` seeded explicitly: the system prompts from
``WorkloadSpec.prompt_seed`` (so every rate and every policy sees the same groups), the
arrivals, group choices and lengths from the ``seed`` given to :func:`generate`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, NamedTuple

CHARS_PER_TOKEN = 4  # the simulator's tokenizer rule (epp.sim.config.CHARS_PER_TOKEN)

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

    def __post_init__(self) -> None:
        if self.groups < 1:
            raise ValueError("groups must be >= 1")
        if self.prefix_tokens < 1:
            raise ValueError("prefix_tokens must be >= 1")
        for name in ("question_tokens", "output_tokens"):
            lo, hi = getattr(self, name)
            if not 1 <= lo <= hi:
                raise ValueError(f"{name} must be a range 1 <= lo <= hi, got {(lo, hi)}")
        if not self.skew >= 0:
            raise ValueError("skew must be >= 0")


class TimedRequest(NamedTuple):
    """One request of the schedule: when to send it (seconds after the start) and what."""

    offset_s: float
    body: dict[str, Any]
    group: int


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


def generate(
    spec: WorkloadSpec,
    rate: float,
    duration: float,
    seed: int,
    prompts: list[str] | None = None,
) -> list[TimedRequest]:
    """The requests arriving in ``[0, duration)`` at mean ``rate``/s, in arrival order.

    Bodies are streaming chat completions (``stream_options.include_usage``) with
    ``messages`` = [system prompt of the request's group, user question]. ``prompts``
    lets callers pass :func:`system_prompts` (spec) once instead of rebuilding it.
    """
    prompts = system_prompts(spec) if prompts is None else prompts
    if len(prompts) != spec.groups:
        raise ValueError("prompts must hold one system prompt per group")
    rng = random.Random(f"requests/{seed}")
    weights = group_weights(spec.groups, spec.skew)
    population = range(spec.groups)
    out: list[TimedRequest] = []
    for i, offset in enumerate(arrival_offsets(rng, rate, duration)):
        group = rng.choices(population, weights)[0]
        question_chars = rng.randint(*spec.question_tokens) * CHARS_PER_TOKEN
        question = text_of_length(rng, question_chars, head=f"Question {i}: ")
        body = {
            "model": spec.model,
            "messages": [
                {"role": "system", "content": prompts[group]},
                {"role": "user", "content": question},
            ],
            "max_tokens": rng.randint(*spec.output_tokens),
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        out.append(TimedRequest(offset, body, group))
    return out
