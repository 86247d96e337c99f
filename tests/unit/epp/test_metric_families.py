"""Families written once and exposed under several names print what prometheus_client's
own Counter, Gauge and Histogram print when every name is written on every event."""

from __future__ import annotations

import random
import re

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from epp.observability.families import Key, Name, OneWrite

BUCKETS = (0.5, 1, 2.5, 10)
CREATED = re.compile(r"^\S+_created(\{.*\})? .*\n", re.M)


def both(key: Key) -> Key:
    return (key[0], key[1])


def first(key: Key) -> Key:
    return (key[0],)


def same(key: Key) -> Key:
    return key


def text(registry: CollectorRegistry) -> str:
    """The exposition without creation times (when each series began differs)."""
    return CREATED.sub("", generate_latest(registry).decode())


def test_every_name_prints_what_writing_it_on_every_event_prints() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    one = OneWrite()
    labels, fewer = ["model", "flow"], ["model"]
    requests = one.counter(
        Name("req_total", "Requests.", labels, both), Name("old_req_total", "Old.", fewer, first)
    )
    running = one.gauge(
        Name("running", "Running.", labels, both), Name("old_running", "Old.", fewer, first)
    )
    latency = one.histogram(
        BUCKETS,
        Name("lat_seconds", "Latency.", labels, both),
        Name("old_lat", "Old.", fewer, first),
    )
    timing = one.histogram(
        BUCKETS, Name("sched_seconds", "Sched.", [], same), Name("old_sched", "Old.", [], same)
    )
    ours.register(one)
    ref_requests = (
        Counter("req_total", "Requests.", labels, registry=theirs),
        Counter("old_req_total", "Old.", fewer, registry=theirs),
    )
    ref_running = (
        Gauge("running", "Running.", labels, registry=theirs),
        Gauge("old_running", "Old.", fewer, registry=theirs),
    )
    ref_latency = (
        Histogram("lat_seconds", "Latency.", labels, buckets=BUCKETS, registry=theirs),
        Histogram("old_lat", "Old.", fewer, buckets=BUCKETS, registry=theirs),
    )
    ref_timing = (
        Histogram("sched_seconds", "Sched.", buckets=BUCKETS, registry=theirs),
        Histogram("old_sched", "Old.", buckets=BUCKETS, registry=theirs),
    )
    assert text(ours) == text(theirs)  # before any write: the unlabelled ones only
    rng = random.Random(7)
    for _ in range(500):
        model, flow = rng.choice("abc"), rng.choice("xyz")
        # values on the bounds too (a bucket counts values up to its bound, inclusive);
        # quarters, whose sums are exact in any order (the older names' sums add the
        # same values in another order)
        value = rng.choice([0.0, 0.5, 1.0, 2.5, 10.0, 11.0, rng.randrange(48) / 4])
        event = rng.randrange(4)
        if event == 0:
            requests.at((model, flow)).inc()
            ref_requests[0].labels(model, flow).inc()
            ref_requests[1].labels(model).inc()
        elif event == 1:
            cell = running.at((model, flow))
            up = rng.random() < 0.6
            cell.inc() if up else cell.dec()
            for gauge, values in ((ref_running[0], (model, flow)), (ref_running[1], (model,))):
                child = gauge.labels(*values)
                child.inc() if up else child.dec()
        elif event == 2:
            latency.at((model, flow)).observe(value)
            ref_latency[0].labels(model, flow).observe(value)
            ref_latency[1].labels(model).observe(value)
        else:
            timing.at(()).observe(value)
            for histogram in ref_timing:
                histogram.observe(value)
    assert text(ours) == text(theirs)


def test_a_merged_series_began_when_its_first_cell_did() -> None:
    registry = CollectorRegistry()
    one = OneWrite()
    cells = one.counter(
        Name("req_total", "Requests.", ["model", "flow"], both),
        Name("old_req_total", "Old.", ["model"], first),
    )
    registry.register(one)
    cells.at(("a", "x")).inc()
    cells.at(("a", "y")).inc(2)
    cells.at(("a", "x")).created, cells.at(("a", "y")).created = 200.0, 100.0
    assert registry.get_sample_value("old_req_total", {"model": "a"}) == 3
    assert registry.get_sample_value("old_req_created", {"model": "a"}) == 100.0
    assert registry.get_sample_value("req_created", {"model": "a", "flow": "x"}) == 200.0


def test_a_histogram_with_negative_bounds_has_no_sum_as_theirs() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    one = OneWrite()
    error = one.histogram((-1, 0, 1), Name("err_seconds", "Error.", [], same))
    ours.register(one)
    reference = Histogram("err_seconds", "Error.", buckets=(-1, 0, 1), registry=theirs)
    for value in (-2.0, -1.0, -0.5, 0.0, 3.0):
        error.at(()).observe(value)
        reference.observe(value)
    assert text(ours) == text(theirs)
    assert ours.get_sample_value("err_seconds_sum") is None
    assert ours.get_sample_value("err_seconds_bucket", {"le": "-1.0"}) == 2
    assert ours.get_sample_value("err_seconds_bucket", {"le": "+Inf"}) == 5


def test_a_cell_is_made_once_per_key() -> None:
    one = OneWrite()
    cells = one.counter(Name("req_total", "Requests.", ["model"], same))
    assert cells.at(("a",)) is cells.at(("a",))
    assert cells.at(("a",)) is not cells.at(("b",))
    assert list(cells.cells) == [("a",), ("b",)]
