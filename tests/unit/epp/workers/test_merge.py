from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from epp.workers.merge import kind, merge


def page(requests: float, in_flight: float, endpoints: float, blocks: float) -> str:
    registry = CollectorRegistry()
    Counter("epp_requests", "r", ["outcome"], registry=registry).labels("routed").inc(requests)
    Gauge("epp_in_flight_requests", "f", ["endpoint"], registry=registry).labels("a").set(in_flight)
    Gauge("epp_endpoints", "e", ["role"], registry=registry).labels("decode").set(endpoints)
    Gauge("epp_prefix_index_blocks", "b", ["plugin"], registry=registry).labels("p").set(blocks)
    Gauge("process_open_fds", "o", registry=registry).set(blocks + 1)
    h = Histogram("epp_scheduling_duration_seconds", "s", buckets=(0.1, 1), registry=registry)
    for _ in range(int(requests)):
        h.observe(0.05)
    return generate_latest(registry).decode()


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def test_counters_and_histograms_add_up_and_gauges_follow_their_meaning() -> None:
    parent = page(requests=0, in_flight=0, endpoints=4, blocks=0)
    merged = samples(
        merge(parent, {0: page(3, 2, 3, 10), 1: page(5, 1, 3, 20)})  # stale endpoint counts
    )
    assert merged[("epp_requests_total", (("outcome", "routed"),))] == 8
    assert merged[("epp_scheduling_duration_seconds_count", ())] == 8
    assert merged[("epp_scheduling_duration_seconds_bucket", (("le", "0.1"),))] == 8
    assert merged[("epp_in_flight_requests", (("endpoint", "a"),))] == 3  # summed
    assert merged[("epp_endpoints", (("role", "decode"),))] == 4  # the parent's
    blocks = {k: v for k, v in merged.items() if k[0] == "epp_prefix_index_blocks"}
    assert blocks == {  # each worker's own index; the parent's (unused) is left out
        ("epp_prefix_index_blocks", (("plugin", "p"), ("worker", "0"))): 10,
        ("epp_prefix_index_blocks", (("plugin", "p"), ("worker", "1"))): 20,
    }
    fds = {k: v for k, v in merged.items() if k[0] == "process_open_fds"}
    assert fds == {
        ("process_open_fds", ()): 1,
        ("process_open_fds", (("worker", "0"),)): 11,
        ("process_open_fds", (("worker", "1"),)): 21,
    }


def test_created_samples_are_left_out_and_a_missing_worker_is_too() -> None:
    parent = page(0, 0, 1, 0)
    one = merge(parent, {1: page(2, 0, 1, 5)})
    merged = samples(one)
    assert ("epp_prefix_index_blocks", (("plugin", "p"), ("worker", "1"))) in merged
    assert not any(name.endswith("_created") for name, _ in merged)
    assert merged[("epp_requests_total", (("outcome", "routed"),))] == 2
    assert one.count("# TYPE epp_requests counter") == 1


def test_kinds() -> None:
    assert kind("process_cpu_seconds", "counter") == "per-process"
    assert kind("epp_requests", "counter") == "sum"
    assert kind("epp_endpoint_status", "gauge") == "parent"
    assert kind("epp_in_flight_requests", "gauge") == "sum"
    assert kind("epp_extproc_open_streams", "gauge") == "sum"
    assert kind("epp_latency_model", "gauge") == "per-worker"
