"""The request path's targets in bench/results/README.md: verdicts computed from the
A/B and streamed runs' rows, and "no run committed yet" without them."""

from __future__ import annotations

from typing import Any

from bench.results_index import chunk_target, cpu_targets, latency_target, throughput_report


def row(path: str, key: str, p50: float, cpu: float | None, side: str = "new") -> dict[str, Any]:
    r: dict[str, Any] = {
        "path": path, "key": key, "side": side, "concurrency": 64, "server_ms": 0.0,
        "stream_chunks": 0, "p50_ms": p50, "p99_ms": p50 * 2, "rps": 1000.0,
        "envoy_cpu_us_per_req": 100.0, "sims_cpu_us_per_req": 100.0,
        "client_cpu_us_per_req": 100.0,
    }  # fmt: skip
    if cpu is not None:
        r["epp_cpu_us_per_req"] = cpu
    return r


def cell(new_cpu: float, new_p50: float) -> list[dict[str, Any]]:
    return [
        row("Envoy alone", "alone", 1.0, None),
        row("EPP grpclib, full (base)", "grpclib-full", 3.0, 800.0, side="old"),
        row("EPP grpclib, full", "grpclib-full", 2.5, 700.0),
        row("EPP native, full", "native-full", new_p50, new_cpu),
        row("picker", "picker", 3.0, 1000.0),
    ]


def test_cpu_targets_judge_the_best_path_against_the_baseline_and_the_picker() -> None:
    vs_base, vs_picker = cpu_targets(cell(new_cpu=360.0, new_p50=2.0))
    assert vs_base[-1] == "met"  # 360 / 800 = 0.45
    assert "EPP native, full 0.45x" in vs_base[2] and "EPP grpclib, full 0.88x" in vs_base[2]
    assert "native" in vs_base[1] and "800 µs" in vs_base[1]
    assert vs_picker[-1] == "met"  # 360 / 1000


def test_a_missed_cpu_target_says_by_how_much() -> None:
    vs_base, vs_picker = cpu_targets(cell(new_cpu=600.0, new_p50=2.0))
    assert vs_base[-1] == "**missed** by 0.25x"  # 600 / 800 = 0.75
    assert vs_picker[-1] == "**missed** by 0.10x"  # 0.6


def test_added_latency_is_set_against_the_pickers() -> None:
    # picker adds 2.0 ms; native 1.0 ms (0.5x), grpclib 1.5 ms (0.75x)
    target = latency_target(cell(new_cpu=500.0, new_p50=2.0))
    assert target[-1] == "met"
    assert "EPP native, full +1.00 ms (0.50x)" in target[2]
    missed = latency_target(cell(new_cpu=500.0, new_p50=2.4))
    assert missed[-1] == "**missed** by 0.10x"  # 1.4 / 2.0 = 0.7, grpclib 0.75


def test_targets_without_a_run_say_so() -> None:
    for target in [*cpu_targets(None), latency_target(None), chunk_target(None)]:
        assert target[2].startswith("No run committed yet") and target[-1] == "\N{EN DASH}"
    assert throughput_report(None)[2].startswith("No run committed yet")


def streamed(
    path: str, key: str, chunks: int, cpu: float, msgs: float, **more: Any
) -> dict[str, Any]:
    r = row(path, key, 1.0, cpu, **more)
    r.update(stream_chunks=chunks, extproc_msgs_per_req=msgs)
    return r


def test_the_chunk_target_is_judged_at_the_highest_concurrency() -> None:
    rows = [
        streamed("EPP native, full", "native-full", -64, 300.0, 6.0),
        streamed("EPP native, full", "native-full", 64, 1940.0, 70.0),  # 1640 / 64 = 25.6
        streamed("EPP grpclib, full (base)", "grpclib-full", -64, 800.0, 6.0, side="old"),
        streamed("EPP grpclib, full (base)", "grpclib-full", 64, 4000.0, 70.0, side="old"),
    ]
    target = chunk_target(rows)
    assert target[-1] == "**missed** by 5.6 µs"
    assert "EPP grpclib, full (base) 50.0 µs" in target[2]  # today's, shown beside
    quiet = [{**r, "concurrency": 1} for r in rows]  # each chunk wakes the EPP: not judged
    busy = [{**r, "concurrency": 128} for r in rows]
    busy[1]["epp_cpu_us_per_req"] = 1300.0  # 1000 / 64 = 15.6 µs
    assert chunk_target(quiet + rows + busy)[-1] == "met"


def test_throughput_is_reported_with_its_prediction_for_more_cores() -> None:
    target = throughput_report(cell(new_cpu=500.0, new_p50=2.0))
    assert target[-1] == "report only"
    assert "(base)" not in target[2]
    # 8 cores / 500 µs = 16,000 for the EPP alone; / 800 µs everything = 10,000
    assert "EPP native, full 1000 (predicted 16000 / 10000, 32000 / 20000)" in target[2]
