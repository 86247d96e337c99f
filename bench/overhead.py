"""``make bench`` -> overhead: what the EPP adds on top of Envoy alone.

Side by side in one run, against the same simulators answering instantly
(``--time-scale 0``): Envoy with a static round-robin cluster, and Envoy + EPP in each
processing mode and event loop. Reports p50/p99 latency, req/s, and CPU per request of
the EPP and of Envoy, at each concurrency. Writes bench/results/overhead.{md,json}.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from bench.host import cpu_seconds, machine_description
from epp.envoyconfig import (
    ClusterKind,
    EnvoyOptions,
    Processing,
    baseline_config,
    epp_config,
)
from epp.envoyproc import EnvoyProcess, write_config
from epp.procs import ManagedProcess, start_epp
from epp.stack import LocalStack, StackOptions

RESULTS = Path(__file__).resolve().parent / "results"
BODY_FILE = Path(tempfile.mkdtemp(prefix="epp-bench-")) / "body.json"


def write_body(prompt_bytes: int) -> None:
    BODY_FILE.write_bytes(
        orjson.dumps(
            {"model": "sim-model", "prompt": "x" * prompt_bytes, "max_tokens": 1, "temperature": 0}
        )
    )


@dataclass
class Path_:
    name: str
    envoy: EnvoyProcess
    epp_pid: int | None


def start_epp_for(stack: LocalStack, name: str, extra: list[str]) -> ManagedProcess:
    endpoints = [a for addr in stack.sim_addresses for a in ("--endpoint", addr)]
    return start_epp(
        stack.workdir, name, "serve", "--grpc-port", "0", "--http-port", "0",
        "--log-level", "warning", *endpoints, *extra,
    )  # fmt: skip


def start_envoy(stack: LocalStack, name: str, config: dict[str, Any]) -> EnvoyProcess:
    workdir = stack.workdir / name
    workdir.mkdir(exist_ok=True)
    return EnvoyProcess(
        write_config(config, workdir / "envoy.yaml"), workdir, concurrency=1
    ).start()


def load(url: str, concurrency: int, duration: float, warmup: float) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "bench.loadgen", "--url", url, "--body-file", str(BODY_FILE),
         "--concurrency", str(concurrency), "--duration", str(duration), "--warmup", str(warmup)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    result: dict[str, Any] = orjson.loads(out.stdout)
    return result


def measure(path: Path_, concurrency: int, duration: float) -> dict[str, Any]:
    url = f"http://127.0.0.1:{path.envoy.port}/v1/completions"
    load(url, concurrency, 1.0, 0.0)  # warm connections, caches, JIT-less Python paths
    envoy_pid = path.envoy.process.pid
    cpu0 = {"envoy": cpu_seconds(envoy_pid)}
    if path.epp_pid:
        cpu0["epp"] = cpu_seconds(path.epp_pid)
    result = load(url, concurrency, duration, 0.0)
    n = max(result["requests"], 1)
    result["envoy_cpu_us_per_req"] = (cpu_seconds(envoy_pid) - cpu0["envoy"]) / n * 1e6
    if path.epp_pid:
        result["epp_cpu_us_per_req"] = (cpu_seconds(path.epp_pid) - cpu0["epp"]) / n * 1e6
    result["path"], result["concurrency"] = path.name, concurrency
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per measurement")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--servers", type=int, default=4)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--prompt-bytes", type=int, default=1000, help="prompt size per request")
    parser.add_argument("--name", default="overhead", help="results file name (without .md)")
    args = parser.parse_args()
    write_body(args.prompt_bytes)

    opts = StackOptions(
        servers=args.servers, envoy_port=0, envoy_admin_port=0, grpc_port=0, http_port=0,
        sim_args=["--time-scale", "0"], log_level="warning",
    )  # fmt: skip
    extra: list[ManagedProcess] = []
    envoys: list[EnvoyProcess] = []
    print(f"starting {args.servers} simulators, EPPs and Envoys...", flush=True)
    with LocalStack(opts) as stack:
        try:
            assert stack.epp is not None
            epp_asyncio = start_epp_for(stack, "epp-asyncio", ["--no-uvloop"])
            epp_grpclib = start_epp_for(stack, "epp-grpclib", ["--transport", "grpclib"])
            extra += [epp_asyncio, epp_grpclib]
            servers = [(h, int(p)) for h, p in (a.split(":") for a in stack.sim_addresses)]

            def via_epp(
                name: str, port: int, processing: Processing, cluster: ClusterKind = "eds"
            ) -> EnvoyProcess:
                opts = EnvoyOptions(
                    listen_port=0, admin_port=0, epp_port=port, processing=processing,
                    cluster=cluster,
                )  # fmt: skip
                envoy = start_envoy(stack, name, epp_config(opts))
                envoys.append(envoy)
                return envoy

            base_opts = EnvoyOptions(listen_port=0, admin_port=0)
            envoys.append(start_envoy(stack, "alone", baseline_config(base_opts, servers)))
            paths = [
                Path_("Envoy alone (round robin)", envoys[0], None),
                Path_("EPP grpcio, full", via_epp("full", stack.grpc_port, "full"),
                      stack.epp.pid),
                Path_("EPP grpcio, lean", via_epp("lean", stack.grpc_port, "lean"),
                      stack.epp.pid),
                Path_("EPP grpclib, full",
                      via_epp("grpclib-full", epp_grpclib.info["grpc_port"], "full"),
                      epp_grpclib.pid),
                Path_("EPP grpclib, lean",
                      via_epp("grpclib-lean", epp_grpclib.info["grpc_port"], "lean"),
                      epp_grpclib.pid),
                Path_("EPP grpclib, lean, ORIGINAL_DST (no EDS/failover)",
                      via_epp("grpclib-lean-odst", epp_grpclib.info["grpc_port"], "lean",
                              "original-dst"),
                      epp_grpclib.pid),
                Path_("EPP grpclib, buffered",
                      via_epp("grpclib-buffered", epp_grpclib.info["grpc_port"], "buffered"),
                      epp_grpclib.pid),
                Path_("EPP grpcio, full, asyncio loop (no uvloop)",
                      via_epp("full-asyncio", epp_asyncio.info["grpc_port"], "full"),
                      epp_asyncio.pid),
            ]  # fmt: skip
            rows = []
            for c in args.concurrency:
                for path in paths:
                    print(f"  c={c:<3} {path.name} ...", end="", flush=True)
                    row = measure(path, c, args.duration)
                    print(f" {row['rps']:.0f} req/s, p50 {row['p50_ms']:.2f} ms", flush=True)
                    rows.append(row)
        finally:
            for envoy in envoys:
                envoy.stop()
            for proc in extra:
                proc.stop()
    write_results(args.out, rows, args)
    return 0


def write_results(out: Path, rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    out.mkdir(parents=True, exist_ok=True)
    meta = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": machine_description(),
        "duration_s": args.duration,
        "servers": args.servers,
    }
    (out / f"{args.name}.json").write_bytes(
        orjson.dumps({"meta": meta, "rows": rows}, option=orjson.OPT_INDENT_2)
    )
    lines = [
        "# Overhead: Envoy alone vs Envoy + EPP",
        "",
        f"Measured {meta['date']} on {meta['machine']} with "
        f"`python -m bench.overhead {' '.join(sys.argv[1:])}` "
        f"({args.duration:g} s per cell, {args.servers} simulators answering instantly, "
        f"non-streaming completions with a {args.prompt_bytes:,}-byte prompt, "
        "each Envoy with `--concurrency 1`, closed-loop "
        "keep-alive clients). Everything shares the same 2 cores, so compare rows within "
        "one table, not absolute numbers across machines.",
        "",
    ]
    for c in sorted({r["concurrency"] for r in rows}):
        cell = [r for r in rows if r["concurrency"] == c]
        base = cell[0]
        lines += [
            f"## Concurrency {c}",
            "",
            "| path | req/s | p50 ms | p99 ms | added p50 ms | added p99 ms "
            "| EPP CPU µs/req | EPP req/s per core | Envoy CPU µs/req | errors |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in cell:
            epp_cpu = r.get("epp_cpu_us_per_req")
            lines.append(
                f"| {r['path']} | {r['rps']:.0f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} "
                f"| {r['p50_ms'] - base['p50_ms']:+.2f} | {r['p99_ms'] - base['p99_ms']:+.2f} "
                f"| {f'{epp_cpu:.0f}' if epp_cpu else '-'} "
                f"| {f'{1e6 / epp_cpu:.0f}' if epp_cpu else '-'} "
                f"| {r['envoy_cpu_us_per_req']:.0f} | {r['errors']} |"
            )
        lines.append("")
    (out / f"{args.name}.md").write_text("\n".join(lines))
    print(f"wrote {out / args.name}.md")


if __name__ == "__main__":
    raise SystemExit(main())
