"""bench.overhead's pure parts: simulator flags, the paths chosen and the generated
reading."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from bench.overhead import (
    EPPS,
    PATHS,
    _epp_code,
    chosen_paths,
    sim_args,
    workloads,
)
from bench.overhead_report import (
    PICKER,
    TARGET_ADDED_MS,
    cells,
    chunk_pairs,
    cpu_bound_ms,
    reading,
    workload,
)
from epp_harness.sim.config import SimConfig
from epp_harness.sim.engine import first_token_seconds
from epp_harness.sim.flags import add_arguments, config_from_args


def row(path: str, p50: float, p99: float, **extra: Any) -> dict[str, Any]:
    r: dict[str, Any] = {
        "path": path, "concurrency": 20, "server_ms": 200.0, "p50_ms": p50, "p99_ms": p99,
        "envoy_cpu_us_per_req": 500.0, "sims_cpu_us_per_req": 1000.0,
        "client_cpu_us_per_req": 500.0, "machine_busy": 0.5, "other_cores": 0.0,
    }  # fmt: skip
    r.update(extra)
    return r


def test_instant_servers_answer_at_once_and_slow_ones_never_queue() -> None:
    assert sim_args(0, 225_280, 20) == ["--time-scale", "0"]
    flags = sim_args(200, 225_280, 20)
    value = dict(zip(flags[::2], flags[1::2], strict=True))
    assert value["--prefill-overhead-ms"] == "200" and value["--time-scale"] == "1"
    assert value["--max-num-seqs"] == "20"  # every client's request runs at once
    blocks = 225_280 / 4 / int(value["--block-size"])
    assert int(value["--kv-blocks"]) >= 20 * blocks  # all prompts fit on one server


def sim_config(flags: list[str]) -> SimConfig:
    """The simulator's config for ``flags``, as `epp sim` parses them."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return config_from_args(parser.parse_args(flags), 8000)


def test_slow_servers_take_their_time_per_completion_whatever_runs_beside() -> None:
    # per-request timing: a 220 KB prompt's first (and only) token comes server_ms after
    # admission, and all 20 clients' requests are admitted at once. In the simulator's
    # steps, each prefill starting in a step adds the overhead to that one step, so a
    # server's prefills would take turns: 200 ms each, one after the other.
    config = sim_config(sim_args(200, 225_280, 20))
    assert config.max_num_batched_tokens == 0 and config.max_num_seqs == 20
    tokens = 225_280 // 4
    assert first_token_seconds(config, tokens, cached=0, received=0) == pytest.approx(0.2)
    assert first_token_seconds(config, tokens, cached=tokens - 1, received=0) == pytest.approx(0.2)


def test_cpu_bound_latency_is_concurrency_times_cpu_over_the_cores_left() -> None:
    r = row("x", 0, 0, epp_cpu_us_per_req=2000.0, other_cores=0.5)
    # 20 requests x 4 ms of CPU each, on 2 - 0.5 cores
    assert cpu_bound_ms(r, cores=2) == 20 * 4.0 / 1.5


def test_reading_sets_realistic_servers_against_the_target() -> None:
    base = row("Envoy alone", 200.0, 210.0)
    near = row("EPP a", 200.0 + TARGET_ADDED_MS - 1, 210.0 + TARGET_ADDED_MS - 1)
    far = row("EPP b", 200.0 + TARGET_ADDED_MS + 1, 210.0, other_cores=1.0)
    text = "\n".join(reading([base, near, far], cores=2))
    assert "1 of 2 paths" in text
    assert "EPP b +6.0 / +0.0 ms*" in text  # busy neighbours marked


def test_reading_predicts_a_saturated_instant_loop_from_cpu() -> None:
    base = row("Envoy alone", 20.0, 30.0, server_ms=0.0, machine_busy=0.99)
    epp = row("EPP a", 60.0, 90.0, server_ms=0.0, machine_busy=0.99, epp_cpu_us_per_req=2000.0)
    text = "\n".join(reading([base, epp], cores=2))
    assert "CPU-bound" in text
    assert "EPP a +20 vs +40 ms" in text  # 20 x 2 ms / 2 cores predicted, 40 measured


def test_streamed_servers_pace_their_tokens() -> None:
    flags = sim_args(0, 1000, 16, token_ms=1.0)
    value = dict(zip(flags[::2], flags[1::2], strict=True))
    assert value["--time-scale"] == "1" and value["--decode-ms-per-token"] == "1"
    assert value["--prefill-overhead-ms"] == "0" and value["--max-num-seqs"] == "16"
    # the steps stay: a batch's tokens come out together
    assert sim_config(flags).max_num_batched_tokens == SimConfig().max_num_batched_tokens


def test_a_streamed_run_measures_each_path_in_one_piece_and_streamed() -> None:
    assert workloads(0) == [0]
    assert [workload(c) for c in workloads(64)] == [
        "63 tokens in one piece",
        "63 tokens streamed in 64 chunks",
    ]


def test_a_streamed_cell_follows_its_one_piece_reference() -> None:
    rows = [
        row("Envoy alone", 1, 2, concurrency=c, server_ms=0.0, stream_chunks=ch)
        for ch in (64, -64)
        for c in (16, 1)
    ]
    assert [(ch, c) for _, ch, c, _ in cells(rows)] == [(-64, 1), (64, 1), (-64, 16), (64, 16)]


def test_each_streamed_row_is_paired_with_its_path_in_one_piece() -> None:
    rows = [
        row(p, 1, 2, stream_chunks=ch, epp_cpu_us_per_req=1.0)
        for ch in (-64, 64)
        for p in ("EPP a", "EPP b")
    ]
    pairs = chunk_pairs(rows)
    assert [(a["path"], b["path"], a["stream_chunks"], b["stream_chunks"]) for a, b in pairs] == [
        ("EPP a", "EPP a", -64, 64),
        ("EPP b", "EPP b", -64, 64),
    ]


def test_every_path_by_default_after_envoy_alone() -> None:
    specs = chosen_paths(None, None)
    assert specs[0].epp is None  # the tables' base
    assert specs[1:] == PATHS
    assert all(s.epp in EPPS or s.epp == PICKER for s in PATHS)


def test_chosen_paths_keep_their_order_and_the_base() -> None:
    specs = chosen_paths(["grpclib-full-2-workers", "grpclib-full"], None)
    assert [s.key for s in specs] == ["alone", "grpclib-full", "grpclib-full-2-workers"]


def test_another_checkout_runs_each_epp_path_right_before_it() -> None:
    specs = chosen_paths(["grpclib-full", "picker"], Path("/tmp/base"))
    assert [s.name for s in specs[1:]] == [
        "EPP grpclib, full (base)",
        "EPP grpclib, full",
        "minimal Python picker (grpcio, uvloop), full",  # not an epp: runs once
    ]
    again = specs[1]
    assert again.workers == 1 and again.epp == "grpclib@/tmp/base"
    flags, env = _epp_code(again.epp)
    assert flags == EPPS["grpclib"] and env["PYTHONPATH"] == "/tmp/base"
    assert _epp_code("grpclib") == (EPPS["grpclib"], {})
