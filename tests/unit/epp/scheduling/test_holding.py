"""The dispatch rule of a held request whose preferred endpoint is full: wait for it
while that is predicted sooner than a miss elsewhere, else spill; on hand-built
snapshots through the real scheduler (its prefix index and latency model)."""

from __future__ import annotations

import random
from dataclasses import replace

from epp.config import build_scheduler
from epp.datastore import Datastore
from epp.scheduling.holding import Hold, waits_for_home
from epp.scheduling.scheduler import ProfileScheduler
from epp.types import Endpoint, InferenceRequest, SchedulingResult

HOME, OTHER = "10.0.0.1:8000", "10.0.0.2:8000"
# 10,000 prompt tokens: a miss costs 10 ms + 10,000 x 0.1 ms = 1.01 s by the priors
PROMPT = "x" * 40_000


def test_the_rule_compares_predictions_and_bounds_the_wait() -> None:
    assert waits_for_home(0.3, 1.0, 0.0)
    assert not waits_for_home(1.2, 1.0, 0.0)  # the home's wait costs more than a miss
    assert not waits_for_home(0.3, 1.0, 1.0)  # waited a miss's time already: spill


def pool(output_tokens: int) -> tuple[ProfileScheduler, Datastore]:
    """Two endpoints of one slot each; a slot held ``10 + 20 x output_tokens`` ms."""
    now = 1000.0
    scheduler = build_scheduler(
        "saturationDetector: {maxConcurrency: 1}\n"
        f"latencyModel: {{maxNumSeqs: 1, outputTokens: {output_tokens}}}\n",
        lambda: now,
    )
    datastore = Datastore(clock=lambda: now)
    for address in (HOME, OTHER):
        host, port = address.split(":")
        datastore.add(Endpoint(host, int(port)))
    # the prompt's prefix is cached at HOME (routed there), whose one slot is busy
    request = InferenceRequest("r0", "m", "/v1/completions", prompt=PROMPT)
    snapshot = datastore.snapshot()
    result = scheduler.schedule(replace(request, subset=frozenset({HOME})), snapshot, rng())
    scheduler.on_routed(request, result, snapshot)
    datastore.acquire(HOME)
    return scheduler, datastore


def rng() -> random.Random:
    return random.Random(0)


def dispatch(
    scheduler: ProfileScheduler, datastore: Datastore, **kwargs: object
) -> SchedulingResult | Hold:
    request = InferenceRequest("r1", "m", "/v1/completions", prompt=PROMPT + " again")
    snapshot = datastore.snapshot()
    room = scheduler.room(request, snapshot)
    assert room == frozenset({OTHER})
    return scheduler.dispatch(request, snapshot, room, rng(), **kwargs)  # type: ignore[arg-type]


def test_a_held_request_waits_for_its_home_when_it_frees_soon() -> None:
    scheduler, datastore = pool(output_tokens=30)  # a slot frees in 0.61 s < a 1.01 s miss
    decision = dispatch(scheduler, datastore)
    assert isinstance(decision, Hold) and decision.address == HOME
    assert abs(decision.wait_s - 0.61) < 1e-9


def test_it_spills_when_the_homes_wait_exceeds_a_miss() -> None:
    scheduler, datastore = pool(output_tokens=60)  # 1.21 s for a slot > a 1.01 s miss
    decision = dispatch(scheduler, datastore)
    assert isinstance(decision, SchedulingResult) and decision.primary.address == OTHER


def test_requests_held_ahead_for_the_home_lengthen_its_wait() -> None:
    scheduler, datastore = pool(output_tokens=30)  # one ahead: 1.22 s > 1.01 s
    decision = dispatch(scheduler, datastore, held_for={HOME: 1})
    assert isinstance(decision, SchedulingResult) and decision.primary.address == OTHER


def test_it_spills_after_waiting_a_miss_and_without_affinity() -> None:
    scheduler, datastore = pool(output_tokens=30)
    late = dispatch(scheduler, datastore, held_s=1.1)
    assert isinstance(late, SchedulingResult) and late.primary.address == OTHER
    off = dispatch(scheduler, datastore, keep_affinity=False)
    assert isinstance(off, SchedulingResult) and off.primary.address == OTHER


def test_a_home_with_room_is_taken_and_all_room_schedules_as_usual() -> None:
    scheduler, datastore = pool(output_tokens=30)
    request = InferenceRequest("r1", "m", "/v1/completions", prompt=PROMPT)
    snapshot = datastore.snapshot()
    home = scheduler.dispatch(request, snapshot, frozenset({HOME, OTHER}), rng())
    assert isinstance(home, SchedulingResult) and home.primary.address == HOME
    every = scheduler.dispatch(request, snapshot, True, rng())
    assert isinstance(every, SchedulingResult) and every.primary.address == HOME
