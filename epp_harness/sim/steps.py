"""Step-level batching: chunked prefill sharing forward steps with running decodes.

vLLM runs one forward step at a time over every running sequence. A step has a token
budget (``max_num_batched_tokens``): each decoding sequence takes one token of it
first, then prefills take what is left in arrival order, the last one cut into a
chunk if it does not fit (vLLM's decode-first chunked-prefill policy). A sequence's
first token comes out of the step that computes the last token of its prompt; each
later token takes one more step. A step lasts as long as its slower side
(:func:`step_seconds`): reading the weights and the decodes' KV, or computing all of
its tokens. So a long prefill chunk lengthens the step for every decode in it: the
interference P/D disaggregation removes. The calibration and its sources are in
docs/simulator.md.

Pure parts (:func:`compose`, :func:`step_seconds`) are checked without an event loop;
:class:`StepLoop` drives them with the engine's injectable sleep.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field

from epp_harness.sim.config import SimConfig


@dataclass(slots=True, eq=False)
class Work:
    """One admitted sequence as the step loop sees it."""

    to_prefill: int  # prompt tokens still to compute (>= 1 until the first token)
    outputs: int  # tokens to generate
    overhead: bool  # the fixed per-request prefill cost is still due
    produced: int = 0
    wake: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def done(self) -> bool:
        return self.produced >= self.outputs

    def advance(self, tokens: int) -> None:
        """Apply one step's ``tokens`` of this sequence."""
        if self.to_prefill:
            self.to_prefill -= tokens
            self.overhead = False
            if self.to_prefill:
                return
        self.produced += 1
        self.wake.set()


@dataclass(frozen=True, slots=True)
class Step:
    """One step's batch: ``(work, tokens)`` in scheduling order, and its shape."""

    entries: tuple[tuple[Work, int], ...]
    decodes: int
    prefill_tokens: int
    prefill_starts: int


def compose(works: list[Work], budget: int) -> Step:
    """The next step over ``works`` (arrival order): decodes first, then prefill chunks
    in arrival order while ``budget`` tokens remain."""
    entries: list[tuple[Work, int]] = []
    left = budget
    decodes = 0
    for work in works:
        if left and not work.to_prefill and not work.done:
            entries.append((work, 1))
            left -= 1
            decodes += 1
    prefill_tokens = starts = 0
    for work in works:
        if left and work.to_prefill:
            chunk = min(work.to_prefill, left)
            entries.append((work, chunk))
            left -= chunk
            prefill_tokens += chunk
            starts += work.overhead
    return Step(tuple(entries), decodes, prefill_tokens, starts)


def step_seconds(config: SimConfig, decodes: int, prefill_tokens: int, starts: int = 0) -> float:
    """How long one step takes (seconds, ``time_scale`` applied).

    The roofline shape Sarathi-Serve describes: a step costs the larger of its memory
    time (``decode_ms_per_token`` to read the weights, plus ``itl_ms_per_running_seq``
    per decode for its KV) and its compute time (``prefill_ms_per_token`` for every
    token in the step), plus ``prefill_overhead_ms`` for each prefill starting in it.
    A decode-only step costs exactly the aggregated simulator's inter-token latency; a
    prefill chunk is free until its compute outgrows the memory time, then every decode
    in the step waits for it.
    """
    memory = config.decode_ms_per_token + config.itl_ms_per_running_seq * decodes
    compute = config.prefill_ms_per_token * (prefill_tokens + decodes)
    ms = max(memory, compute) + config.prefill_overhead_ms * starts
    return ms * config.time_scale / 1000.0


def interference_seconds(config: SimConfig, decodes: int, prefill_tokens: int) -> float:
    """What ``prefill_tokens`` in a step add to the inter-token latency of its decodes."""
    return step_seconds(config, decodes, prefill_tokens) - step_seconds(config, decodes, 0)


class StepLoop:
    """Runs steps while any admitted sequence has work; one per engine (one event loop)."""

    def __init__(self, config: SimConfig, sleep: Callable[[float], Awaitable[None]]) -> None:
        self.config = config
        self._sleep = sleep
        self._works: list[Work] = []
        self._task: asyncio.Task[None] | None = None

    async def pace(
        self, prefill_tokens: int, outputs: int, overhead: bool
    ) -> AsyncGenerator[None, None]:
        """Yield once per output token, when the step that makes it ends. Close it
        (``aclosing``) to leave the batch early."""
        work = Work(to_prefill=max(1, prefill_tokens), outputs=outputs, overhead=overhead)
        self._works.append(work)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())
        try:
            for consumed in range(outputs):
                while work.produced <= consumed:
                    work.wake.clear()
                    await work.wake.wait()
                yield
        finally:
            self._works.remove(work)

    async def _run(self) -> None:
        while True:
            step = compose(self._works, self.config.max_num_batched_tokens)
            if not step.entries:
                self._task = None
                return
            delay = step_seconds(
                self.config, step.decodes, step.prefill_tokens, step.prefill_starts
            )
            await (self._sleep(delay) if delay > 0 else asyncio.sleep(0))
            for work, tokens in step.entries:
                work.advance(tokens)
