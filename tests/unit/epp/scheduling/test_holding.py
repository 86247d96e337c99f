"""The dispatch rule of a held request: the scheduler's pick over every endpoint (the
requests held ahead counted where they wait); wait for it when it is full. With the
latency scorer the pick weighs the home's predicted wait against a miss elsewhere. On
hand-built snapshots through the real scheduler (its prefix index and latency model)."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

from epp.config import build_scheduler
from epp.datastore import Datastore
from epp.flowcontrol.holding import Hold, with_held
from epp.scheduling.scheduler import ProfileScheduler
from epp.types import Endpoint, InferenceRequest, SchedulingResult, Snapshot

HOME, OTHER = "10.0.0.1:8000", "10.0.0.2:8000"
# 4,000 prompt tokens (all of them matched at HOME): a miss elsewhere costs
# 10 ms + 4,000 x 0.1 ms = 0.41 s by the priors
PROMPT = "x" * 16_000
# the latency scorer: the pick weighs each endpoint's predicted time to first token
PREDICTED = (Path(__file__).resolve().parents[4] / "configs" / "predicted-latency.yaml").read_text()


def test_held_requests_count_as_in_flight_where_they_wait() -> None:
    snapshot = Snapshot((), {HOME: 1})
    assert with_held(snapshot, None) is snapshot
    assert with_held(snapshot, {HOME: 2, OTHER: 1}).in_flight == {HOME: 3, OTHER: 1}
    assert snapshot.in_flight == {HOME: 1}


def pool(output_tokens: int) -> tuple[ProfileScheduler, Datastore]:
    """Two endpoints of one slot each; a slot held ``10 + 20 x output_tokens`` ms."""
    now = 1000.0
    scheduler = build_scheduler(
        PREDICTED + "saturationDetector: {maxConcurrency: 1}\n"
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
    scheduler, datastore = pool(output_tokens=12)  # a slot frees in 0.25 s < a 0.41 s miss
    decision = dispatch(scheduler, datastore)
    assert isinstance(decision, Hold) and decision.address == HOME
    assert abs(decision.wait_s - 0.25) < 1e-9


def test_it_spills_when_the_homes_wait_exceeds_a_miss() -> None:
    scheduler, datastore = pool(output_tokens=30)  # 0.61 s for a slot > a 0.41 s miss
    decision = dispatch(scheduler, datastore)
    assert isinstance(decision, SchedulingResult) and decision.primary.address == OTHER


def test_requests_held_ahead_for_the_home_lengthen_its_wait() -> None:
    scheduler, datastore = pool(output_tokens=12)  # one held ahead: 0.5 s > 0.41 s
    decision = dispatch(scheduler, datastore, held_for={HOME: 1})
    assert isinstance(decision, SchedulingResult) and decision.primary.address == OTHER


def test_without_affinity_it_goes_where_there_is_room() -> None:
    scheduler, datastore = pool(output_tokens=30)
    off = dispatch(scheduler, datastore, keep_affinity=False)
    assert isinstance(off, SchedulingResult) and off.primary.address == OTHER


def test_a_home_with_room_is_taken_and_all_room_schedules_as_usual() -> None:
    scheduler, datastore = pool(output_tokens=12)
    request = InferenceRequest("r1", "m", "/v1/completions", prompt=PROMPT)
    snapshot = datastore.snapshot()
    home = scheduler.dispatch(request, snapshot, frozenset({HOME, OTHER}), rng())
    assert isinstance(home, SchedulingResult) and home.primary.address == HOME
    every = scheduler.dispatch(request, snapshot, True, rng())
    assert isinstance(every, SchedulingResult) and every.primary.address == HOME
