"""bench.overhead's A/B parts: another checkout's CLI read from its --help, the flags
adapted to it, the medians of repeated cells, the new/old ratios and the CPU per
streamed chunk."""

from __future__ import annotations

from typing import Any

import pytest

from bench.overhead_ab import adapt_argv, cli_options, cpu_ratios, median_rows, per_chunk_us

# the shape of argparse's --help for `epp serve` before --grpc-health-port existed
OLD_HELP = """\
usage: epp serve [-h] [--listen-host LISTEN_HOST] [--grpc-port GRPC_PORT]
                 [--http-port HTTP_PORT] [--endpoint HOST:PORT]
                 [--transport {grpcio,grpclib}] [--no-uvloop]
                 [--log-level {debug,info,warning,error}]

options:
  -h, --help            show this help message and exit
  --grpc-port GRPC_PORT
                        ext_proc gRPC port (0 = any free port)
  --http-port HTTP_PORT
                        HTTP port for /metrics and /health
  --endpoint HOST:PORT  a model server to route to (role decode)
  --transport {grpcio,grpclib}
                        gRPC server library carrying ext_proc streams
  --no-uvloop           use asyncio's default event loop
  --log-level {debug,info,warning,error}
                        how much to log (see --http-port)
"""
FLAGS = ["--grpc-port", "0", "--http-port", "0", "--grpc-health-port", "0"]


def test_help_gives_each_option_and_its_choices() -> None:
    options = cli_options(OLD_HELP)
    assert options["--transport"] == frozenset({"grpcio", "grpclib"})
    assert options["--log-level"] == frozenset({"debug", "info", "warning", "error"})
    assert options["--grpc-port"] is None and options["--no-uvloop"] is None
    assert "--grpc-health-port" not in options
    assert "-h" not in options  # short forms are not the harness's flags


def test_an_optional_flag_the_old_cli_lacks_is_left_out_with_its_value() -> None:
    argv, note = adapt_argv(
        [*FLAGS, "--endpoint", "127.0.0.1:1", "--endpoint", "127.0.0.1:2", "--no-uvloop"],
        cli_options(OLD_HELP),
    )
    assert argv == [
        "--grpc-port", "0", "--http-port", "0", "--endpoint", "127.0.0.1:1",
        "--endpoint", "127.0.0.1:2", "--no-uvloop",
    ]  # fmt: skip
    assert note == "left out --grpc-health-port"


def test_every_flag_known_passes_unchanged() -> None:
    argv = ["--grpc-port", "0", "--transport", "grpclib", "--log-level", "warning"]
    assert adapt_argv(argv, cli_options(OLD_HELP)) == (argv, "")


@pytest.mark.parametrize(
    ("argv", "why"),
    [
        (["--transport", "native"], "its --transport takes grpcio, grpclib, not native"),
        (["--workers", "2"], "its CLI has no --workers"),
    ],
)
def test_a_path_the_old_cli_cannot_serve_is_refused_with_the_reason(
    argv: list[str], why: str
) -> None:
    assert adapt_argv([*FLAGS, *argv], cli_options(OLD_HELP)) == (None, why)


def row(path: str, repeat: int, cpu: float, **extra: Any) -> dict[str, Any]:
    r: dict[str, Any] = {
        "path": path, "key": path.split()[0], "concurrency": 64, "server_ms": 0.0,
        "stream_chunks": 0, "repeat": repeat, "rps": 100.0 * (repeat + 1),
        "epp_cpu_us_per_req": cpu, "side": "new",
    }  # fmt: skip
    r.update(extra)
    return r


def test_medians_per_cell_and_path_keep_the_first_seen_order() -> None:
    runs = [
        row("b", 0, 300.0),
        row("a", 0, 10.0),
        row("b", 1, 100.0, epp_process_cpu_us_per_req=[1.0, 5.0]),
        row("a", 1, 30.0),
        row("b", 2, 200.0),
        row("a", 0, 7.0, concurrency=1),
    ]
    runs[0]["epp_process_cpu_us_per_req"] = [3.0, 1.0]
    medians = median_rows(runs)
    assert [(m["path"], m["concurrency"]) for m in medians] == [("b", 64), ("a", 64), ("a", 1)]
    b = medians[0]
    assert b["epp_cpu_us_per_req"] == 200.0 and b["rps"] == 200.0 and b["repeats"] == 3
    assert b["epp_process_cpu_us_per_req"] == [2.0, 3.0]  # element by element
    assert medians[1]["epp_cpu_us_per_req"] == 20.0
    assert "repeat" not in b  # a repeat's index is no figure


def test_the_ratio_is_the_median_of_each_repeats_pair() -> None:
    runs = [
        row("grpclib (base)", 0, 1000.0, key="grpclib", side="old"),
        row("grpclib", 0, 600.0),
        row("grpclib (base)", 1, 800.0, key="grpclib", side="old"),
        row("grpclib", 1, 800.0),
        row("grpclib (base)", 2, 1000.0, key="grpclib", side="old"),
        row("grpclib", 2, 400.0),
        row("picker", 0, 500.0),  # one side only: no ratio
    ]
    (ab,) = cpu_ratios(runs)
    assert ab["key"] == "grpclib" and ab["concurrency"] == 64
    assert ab["ratios"] == [0.6, 1.0, 0.4]
    assert ab["ratio"] == 0.6


def test_cpu_per_chunk_divides_by_the_extra_messages_envoy_counted() -> None:
    plain = {"epp_cpu_us_per_req": 500.0, "stream_chunks": -64, "extproc_msgs_per_req": 6.0}
    streamed = {"epp_cpu_us_per_req": 1500.0, "stream_chunks": 64, "extproc_msgs_per_req": 56.0}
    assert per_chunk_us(plain, streamed) == 20.0  # 1000 µs over 50 chunks that arrived alone


def test_cpu_per_chunk_without_counters_divides_by_the_chunks_written() -> None:
    plain = {"epp_cpu_us_per_req": 500.0, "stream_chunks": -64}
    streamed = {"epp_cpu_us_per_req": 1780.0, "stream_chunks": 64}
    assert per_chunk_us(plain, streamed) == 20.0
    same = {"epp_cpu_us_per_req": 900.0, "stream_chunks": 64, "extproc_msgs_per_req": 6.0}
    assert per_chunk_us({**plain, "extproc_msgs_per_req": 6.0}, same) is None


def test_cpu_per_chunk_is_net_of_the_epps_idle_work() -> None:
    # 50 ms of scrapes a second: 5,000 µs per request at 10 req/s, 2,500 at 20
    plain = {"epp_cpu_us_per_req": 5500.0, "rps": 10.0, "epp_idle_cpu_us_per_s": 50_000.0}
    streamed = {
        "epp_cpu_us_per_req": 4280.0, "rps": 20.0, "epp_idle_cpu_us_per_s": 50_000.0,
        "stream_chunks": 64,
    }  # fmt: skip
    assert per_chunk_us(plain, streamed) == 20.0  # (1780 - 500) µs over 64 chunks
