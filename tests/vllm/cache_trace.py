"""Seeded request traces for comparing prefix caches (pure): shared prefixes picked with
equal or Zipf popularity, each with a unique question; exact repeats of an earlier
prompt; next turns (an earlier prompt, the answer that server gave it, a new
question). Outputs of varied length, so some complete blocks.

A trace is a list of :class:`Step`; :class:`Replay` turns each step into the prompt one
server gets, from that server's own earlier prompts and outputs (a next turn contains
the server's own answer, which differs between servers)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

VOCAB = range(10, 1000)  # ids the tiny model's vocabulary has, clear of special ones
MAX_TOKENS = 1900  # prompt + output stay under the servers' --max-model-len 2048


@dataclass(frozen=True, slots=True)
class Step:
    """``fresh``: new ids appended (the question); ``prefix``: a shared prefix's ids
    (new requests); ``ref``: the earlier step repeated (``turn`` False) or continued."""

    fresh: tuple[int, ...]
    max_tokens: int
    prefix: tuple[int, ...] = ()
    ref: int | None = None
    turn: bool = False

    @property
    def kind(self) -> str:
        return "new" if self.ref is None else ("turn" if self.turn else "repeat")


def make_trace(
    seed: int,
    requests: int,
    *,
    groups: int = 4,
    zipf: float = 0.0,
    repeats: float = 0.15,
    turns: float = 0.2,
    block_size: int = 128,
) -> list[Step]:
    """``requests`` steps; ``zipf`` 0 picks prefixes with equal popularity, else with
    weight 1 / rank**zipf."""
    rng = random.Random(seed)

    def ids(n: int) -> tuple[int, ...]:
        return tuple(rng.choice(VOCAB) for _ in range(n))

    prefixes = [ids(rng.randint(block_size - 30, 4 * block_size + 30)) for _ in range(groups)]
    weights = [1.0 / (rank + 1) ** zipf for rank in range(groups)]
    lengths: list[int] = []  # each step's prompt + output length
    steps: list[Step] = []
    for _ in range(requests):
        out = rng.choice([1, rng.randint(1, 40), rng.randint(40, 2 * block_size)])
        roll = rng.random()
        if steps and roll < repeats:
            ref = rng.randrange(len(steps))
            step = Step((), out, ref=ref)
            prompt = lengths[ref] - steps[ref].max_tokens
        elif steps and roll < repeats + turns:
            ref = rng.randrange(len(steps))
            question = ids(rng.randint(10, block_size))
            step = Step(question, out, ref=ref, turn=True)
            prompt = lengths[ref] + len(question)
        else:
            prefix = rng.choices(prefixes, weights)[0]
            question = ids(rng.randint(10, 2 * block_size))
            step = Step(question, out, prefix=prefix)
            prompt = len(prefix) + len(question)
        if prompt + out > MAX_TOKENS:
            prefix = rng.choices(prefixes, weights)[0]
            step = Step(ids(rng.randint(10, block_size)), out, prefix=prefix)
            prompt = len(prefix) + len(step.fresh)
        steps.append(step)
        lengths.append(prompt + out)
    return steps


@dataclass
class Replay:
    """One server's view of a trace: the prompts it was sent and the outputs it gave."""

    prompts: list[list[int]] = field(default_factory=list)
    outputs: list[list[int]] = field(default_factory=list)

    def prompt(self, step: Step) -> list[int]:
        if step.ref is None:
            return [*step.prefix, *step.fresh]
        earlier = self.prompts[step.ref]
        if not step.turn:
            return list(earlier)
        return [*earlier, *self.outputs[step.ref], *step.fresh]

    def record(self, prompt: list[int], output: list[int]) -> None:
        self.prompts.append(prompt)
        self.outputs.append(output)
