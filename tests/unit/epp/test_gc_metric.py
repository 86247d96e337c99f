"""epp_gc_pause_seconds: the collector's pauses, timed per generation while watched."""

from __future__ import annotations

import gc

from epp.datastore import Datastore
from epp.observability.metrics import EppMetrics


def test_gc_pauses_are_timed_per_generation_until_stopped() -> None:
    metrics = EppMetrics(Datastore())

    def sample(name: str, generation: str) -> float:
        value = metrics.registry.get_sample_value(name, {"generation": generation})
        return value or 0.0

    callbacks = len(gc.callbacks)
    stop = metrics.watch_gc()
    gc.collect()  # a full pass
    gc.collect(0)
    assert sample("epp_gc_pause_seconds_count", "2") >= 1
    assert sample("epp_gc_pause_seconds_count", "0") >= 1
    assert sample("epp_gc_pause_seconds_sum", "2") > 0
    stop()
    assert len(gc.callbacks) == callbacks
    before = sample("epp_gc_pause_seconds_count", "2")
    gc.collect()
    assert sample("epp_gc_pause_seconds_count", "2") == before  # no longer watched
