"""``make bench`` -> overhead: what the EPP adds on top of Envoy alone.

Side by side in one run, against the same simulators: Envoy with a static round-robin
cluster, and Envoy + EPP per processing mode, transport and event loop. Reports p50/p99
latency, req/s, CPU per request of the EPP and of Envoy, and how busy the machine was,
at each concurrency. Writes bench/results/overhead.{md,json} (``--name``).

``--server-ms`` sets how long the simulators take per completion; each value runs every
path again. With instant servers (0, the default) a closed loop saturates the machine,
so the tables show throughput and CPU per request; with realistic servers (e.g. 200 ms)
the machine has room to spare and the added latency is the EPP's own.
"""

from __future__ import annotations

import argparse
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import orjson

from bench import workers
from bench.host import cpu_seconds, machine_cpu, machine_description
from epp_harness.envoyconfig import (
    ClusterKind,
    EnvoyOptions,
    Processing,
    baseline_config,
    epp_config,
)
from epp_harness.envoyproc import EnvoyProcess, write_config
from epp_harness.procs import ManagedProcess, spawn_epp
from epp_harness.stack import LocalStack, StackOptions

RESULTS = Path(__file__).resolve().parent / "results"
# The target for the EPP's added latency with 220 KB prompts at concurrency 20: small
# beside a model server's own time to first token, so routing never shows to a user.
TARGET_ADDED_MS = 5.0
# A cell this busy is CPU-bound: latency there is mostly queueing for the cores.
SATURATED = 0.9
# Other work on the machine above this many cores skews a cell (marked in the reading).
BUSY_NEIGHBOURS = 0.25
CHARS_PER_TOKEN = 4  # the simulators' token estimate (epp_harness/sim/config.py)
# KV block size of simulators that take time: large blocks keep their own prefix-cache
# hashing (blake2b per block, ~3 ms per 220 KB prompt at 16 tokens) from loading the
# shared cores; with no per-token prefill cost, block size changes no latency.
SIM_BLOCK_TOKENS = 1024
# Clients of servers that take time pause a random time (this share of it on average)
# between requests: behind servers that all take exactly the same time, closed-loop
# clients otherwise move in lockstep and reach the EPP in bursts of `concurrency`.
THINK_SHARE = 0.5
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
    # a worker row: how many (1: the plain process), and the group's HTTP port (2+)
    workers: int = 0
    http_port: int = 0


def spawn_epp_for(stack: LocalStack, key: str) -> ManagedProcess:
    """Start the EPP process ``key`` names (:func:`_epp_code`) on the simulators;
    returns at once (call wait_ready())."""
    flags, env = _epp_code(key)
    endpoints = [a for addr in stack.sim_addresses for a in ("--endpoint", addr)]
    return spawn_epp(
        stack.workdir, _file_name(key), "serve", "--grpc-port", "0", "--http-port", "0",
        "--grpc-health-port", "0", "--log-level", "warning", *endpoints, *flags, env=env,
    )  # fmt: skip


def _file_name(key: str) -> str:
    return key.replace("/", "_")


def start_envoy(stack: LocalStack, name: str, config: dict[str, Any]) -> EnvoyProcess:
    workdir = stack.workdir / name
    workdir.mkdir(exist_ok=True)
    return EnvoyProcess(
        write_config(config, workdir / "envoy.yaml"), workdir, concurrency=1
    ).start()


def load(
    url: str, concurrency: int, duration: float, warmup: float, think_ms: float = 0.0
) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "bench.loadgen", "--url", url, "--body-file", str(BODY_FILE),
         "--concurrency", str(concurrency), "--duration", str(duration), "--warmup", str(warmup),
         "--think-ms", str(think_ms)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    result: dict[str, Any] = orjson.loads(out.stdout)
    return result


def measure(
    path: Path_, concurrency: int, duration: float, sim_pids: list[int], think_ms: float
) -> dict[str, Any]:
    url = f"http://127.0.0.1:{path.envoy.port}/v1/completions"
    load(url, concurrency, 1.0, 0.0)  # warm connections, caches, JIT-less Python paths
    pids = {"envoy": [path.envoy.process.pid], "sims": sim_pids}
    if path.epp_pid:
        pids["epp"] = [path.epp_pid]
    group = workers.group(path.http_port) if path.workers > 1 else []
    if group:
        pids["epp"] += [w["pid"] for w in group]
    seen0 = [workers.requests_seen(w["http_port"]) for w in group]  # not in the CPU counted
    before = {k: sum(cpu_seconds(p) for p in ps) for k, ps in pids.items()}
    process_cpu0 = [cpu_seconds(p) for p in pids["epp"]] if path.workers else []
    client0 = children_cpu_seconds()
    busy0, total0 = machine_cpu()
    start = time.monotonic()
    result = load(url, concurrency, duration, 0.0, think_ms)
    wall = time.monotonic() - start
    busy1, total1 = machine_cpu()
    spent = {k: sum(cpu_seconds(p) for p in ps) - before[k] for k, ps in pids.items()}
    spent["client"] = children_cpu_seconds() - client0  # the load generator
    if path.workers:
        n_req = max(result["requests"], 1)
        result["workers"] = path.workers
        result["epp_process_cpu_us_per_req"] = [
            (cpu_seconds(p) - c0) / n_req * 1e6
            for p, c0 in zip(pids["epp"], process_cpu0, strict=True)
        ]
        seen = [workers.requests_seen(w["http_port"]) for w in group]
        result["worker_shares"] = workers.shares(seen0, seen) if group else [1.0]
    busy = (busy1 - busy0) / max(total1 - total0, 1.0)
    result["machine_busy"] = busy
    # cores taken by work outside this run (other jobs on a shared machine)
    result["other_cores"] = max(0.0, busy * (os.cpu_count() or 1) - sum(spent.values()) / wall)
    n = max(result["requests"], 1)
    for k, seconds in spent.items():
        result[f"{k}_cpu_us_per_req"] = seconds / n * 1e6
    result["path"], result["concurrency"] = path.name, concurrency
    return result


def children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def sim_args(server_ms: float, prompt_bytes: int, concurrency: int) -> list[str]:
    """Simulator flags: answer instantly (0), or take ``server_ms`` per completion
    however many requests run at once and wherever the EPP sends them (no queueing, KV
    for ``concurrency`` prompts on one server), so the servers add no latency of their
    own that differs between paths."""
    if server_ms == 0:
        return ["--time-scale", "0"]
    blocks_per_request = math.ceil(prompt_bytes / CHARS_PER_TOKEN / SIM_BLOCK_TOKENS) + 2
    return [
        "--time-scale", "1", "--prefill-overhead-ms", f"{server_ms:g}",
        "--prefill-ms-per-token", "0", "--decode-ms-per-token", "0",
        "--itl-ms-per-running-seq", "0", "--block-size", str(SIM_BLOCK_TOKENS),
        "--max-num-seqs", str(concurrency),
        "--kv-blocks", str(max(8192, 2 * blocks_per_request * concurrency)),
    ]  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per measurement")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--servers", type=int, default=4)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--prompt-bytes", type=int, default=1000, help="prompt size per request")
    parser.add_argument("--name", default="overhead", help="results file name (without .md)")
    parser.add_argument(
        "--paths",
        nargs="+",
        choices=[s.key for s in PATHS],
        help="run only these paths (default: all); Envoy alone, the tables' base, always runs",
    )
    parser.add_argument(
        "--also-from",
        type=Path,
        metavar="CHECKOUT",
        help="also run each chosen EPP path on the epp package of another checkout of this "
        "repository (e.g. `git worktree add /tmp/base COMMIT`), rows marked with its name: "
        "before and after a change in one run",
    )
    parser.add_argument(
        "--server-ms",
        type=float,
        nargs="+",
        default=[0.0],
        help="simulated time per completion (0 = instant); each value runs every path",
    )
    args = parser.parse_args()
    write_body(args.prompt_bytes)
    rows = []
    for server_ms in args.server_ms:
        rows += run_paths(args, server_ms)
    write_results(args.out, rows, args)
    return 0


@dataclass(frozen=True)
class PathSpec:
    """One row: which EPP process (a key of :data:`EPPS`; None: Envoy alone) and how
    its Envoy talks to it."""

    key: str  # --paths names it
    name: str
    epp: str | None
    processing: Processing = "full"
    cluster: ClusterKind = "eds"
    graceful_close: bool = True
    workers: int = 0  # a worker row (its processes listed): how many; 0 = not one


# each EPP process's `epp serve` flags; started only if a chosen path uses it
EPPS = {
    "grpcio": ["--transport", "grpcio"],
    "asyncio": ["--transport", "grpcio", "--no-uvloop"],
    "grpclib": ["--transport", "grpclib"],
    # its own process: the garbage the resets leave must not slow other rows
    "grpclib-resets": ["--transport", "grpclib"],
    "grpclib-2-workers": ["--transport", "grpclib", "--workers", "2", "--worker-base-port", "0"],
    "native": ["--transport", "native"],
}
BASELINE = PathSpec("alone", "Envoy alone (round robin)", None)
PATHS = [
    PathSpec("grpcio-full", "EPP grpcio, full", "grpcio"),
    PathSpec("grpcio-lean", "EPP grpcio, lean", "grpcio", "lean"),
    PathSpec("grpclib-full", "EPP grpclib, full", "grpclib", workers=1),
    PathSpec("grpclib-full-2-workers", "EPP grpclib, full, 2 workers", "grpclib-2-workers",
             workers=2),
    PathSpec("grpclib-lean", "EPP grpclib, lean", "grpclib", "lean"),
    PathSpec("grpclib-lean-odst", "EPP grpclib, lean, ORIGINAL_DST (no EDS/failover)",
             "grpclib", "lean", "original-dst"),
    PathSpec("grpclib-buffered", "EPP grpclib, buffered", "grpclib", "buffered"),
    PathSpec("grpcio-buffered", "EPP grpcio, buffered", "grpcio", "buffered"),
    PathSpec("grpcio-full-asyncio", "EPP grpcio, full, asyncio loop (no uvloop)", "asyncio"),
    PathSpec("native-full", "EPP native, full", "native"),
    PathSpec("native-lean", "EPP native, lean", "native", "lean"),
    PathSpec("grpclib-full-resets",
             "EPP grpclib, full, Envoy resets streams (no graceful close)", "grpclib-resets",
             graceful_close=False),
]  # fmt: skip


def chosen_paths(keys: list[str] | None, also_from: Path | None) -> list[PathSpec]:
    """The baseline, then the chosen paths (all by default) in :data:`PATHS`' order;
    with ``also_from`` each EPP path again right after it, on that checkout's code."""
    picked = [s for s in PATHS if keys is None or s.key in keys]
    out = [BASELINE]
    for spec in picked:
        out.append(spec)
        if also_from is not None:
            out.append(
                replace(
                    spec,
                    key=f"{spec.key}@{also_from.name}",
                    name=f"{spec.name} ({also_from.name})",
                    epp=f"{spec.epp}@{also_from.resolve()}",
                )
            )
    return out


def run_paths(args: argparse.Namespace, server_ms: float) -> list[dict[str, Any]]:
    """The chosen paths at every concurrency, against simulators taking ``server_ms``."""
    opts = StackOptions(
        servers=args.servers, envoy_port=0, envoy_admin_port=0, grpc_port=0, http_port=0,
        sim_args=sim_args(server_ms, args.prompt_bytes, max(args.concurrency)),
        epp=False, log_level="warning",
    )  # fmt: skip
    specs = chosen_paths(args.paths, args.also_from)
    epps: dict[str, ManagedProcess] = {}
    envoys: list[EnvoyProcess] = []
    rows = []
    print(f"starting {args.servers} simulators ({server_ms:g} ms per completion), "
          "EPPs and Envoys...", flush=True)  # fmt: skip
    with LocalStack(opts) as stack:
        try:
            servers = [(h, int(p)) for h, p in (a.split(":") for a in stack.sim_addresses)]
            sim_pids = [sim.pid for sim in stack.sims]
            for key in dict.fromkeys(s.epp for s in specs if s.epp is not None):
                epps[key] = spawn_epp_for(stack, key)
            for proc in epps.values():
                proc.wait_ready()

            def start_path(spec: PathSpec) -> Path_:
                workdir = _file_name(spec.key)
                if spec.epp is None:
                    config = baseline_config(EnvoyOptions(listen_port=0, admin_port=0), servers)
                    envoys.append(start_envoy(stack, workdir, config))
                    return Path_(spec.name, envoys[-1], None)
                epp = epps[spec.epp]
                ports = epp.info["grpc_ports"]
                opts = EnvoyOptions(
                    listen_port=0, admin_port=0, epp_port=epp.info["grpc_port"],
                    processing=spec.processing, cluster=spec.cluster,
                    graceful_close=spec.graceful_close,
                    more_epps=tuple(("127.0.0.1", p) for p in ports[1:]),
                )  # fmt: skip
                envoys.append(start_envoy(stack, workdir, epp_config(opts)))
                http_port = int(epp.info["http_port"]) if spec.workers > 1 else 0
                return Path_(spec.name, envoys[-1], epp.pid, spec.workers, http_port)

            paths = [start_path(spec) for spec in specs]
            for c in args.concurrency:
                for path in paths:
                    print(f"  c={c:<3} {path.name} ...", end="", flush=True)
                    row = measure(path, c, args.duration, sim_pids, server_ms * THINK_SHARE)
                    row["server_ms"] = server_ms
                    print(f" {row['rps']:.0f} req/s, p50 {row['p50_ms']:.2f} ms", flush=True)
                    rows.append(row)
        finally:
            for envoy in envoys:
                envoy.stop()
            for proc in epps.values():
                proc.stop()
    return rows


def _epp_code(key: str) -> tuple[list[str], dict[str, str]]:
    """An EPP key's flags, and its environment: ``KEY@DIR`` runs the epp package of the
    checkout DIR (first on PYTHONPATH, and the current directory, which ``python -m``
    would put before it, left out; its workers inherit both)."""
    name, _, checkout = key.partition("@")
    return EPPS[name], ({"PYTHONPATH": checkout, "PYTHONSAFEPATH": "1"} if checkout else {})


def write_results(out: Path, rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    out.mkdir(parents=True, exist_ok=True)
    meta = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": machine_description(),
        "duration_s": args.duration,
        "servers": args.servers,
        "cores": os.cpu_count() or 1,
    }
    (out / f"{args.name}.json").write_bytes(
        orjson.dumps({"meta": meta, "rows": rows}, option=orjson.OPT_INDENT_2)
    )
    lines = [
        "# Overhead: Envoy alone vs Envoy + EPP",
        "",
        f"Measured {meta['date']} on {meta['machine']} with "
        f"`python -m bench.overhead {' '.join(sys.argv[1:])}` "
        f"({args.duration:g} s per cell, {args.servers} simulators, "
        f"non-streaming completions with a {args.prompt_bytes:,}-byte prompt, "
        "each Envoy with `--concurrency 1`, closed-loop "
        "keep-alive clients). Everything shares the same cores, so compare rows within "
        "one table, not absolute numbers across machines. *machine busy* is the share of "
        "all cores in use during the cell (everything on the machine, not only this run).",
        "",
    ]
    for server_ms, c, cell in cells(rows):
        server = "instant servers" if server_ms == 0 else f"servers taking {server_ms:g} ms"
        base = cell[0]
        lines += [
            f"## Concurrency {c}, {server}",
            "",
            "| path | req/s | p50 ms | p99 ms | added p50 ms | added p99 ms "
            "| EPP CPU µs/req | EPP req/s per core | Envoy CPU µs/req "
            "| servers + client CPU µs/req | machine busy | other work (cores) | errors |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in cell:
            epp_cpu = r.get("epp_cpu_us_per_req")
            lines.append(
                f"| {r['path']} | {r['rps']:.0f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} "
                f"| {r['p50_ms'] - base['p50_ms']:+.2f} | {r['p99_ms'] - base['p99_ms']:+.2f} "
                f"| {f'{epp_cpu:.0f}' if epp_cpu else '-'} "
                f"| {f'{1e6 / epp_cpu:.0f}' if epp_cpu else '-'} "
                f"| {r['envoy_cpu_us_per_req']:.0f} "
                f"| {r['sims_cpu_us_per_req'] + r['client_cpu_us_per_req']:.0f} "
                f"| {r['machine_busy']:.0%} | {r['other_cores']:.2f} | {r['errors']} |"
            )
        lines.append("")
    lines += workers.table(rows)
    lines += reading(rows, int(meta["cores"]))
    (out / f"{args.name}.md").write_text("\n".join(lines))
    print(f"wrote {out / args.name}.md")


def cells(rows: list[dict[str, Any]]) -> list[tuple[float, int, list[dict[str, Any]]]]:
    """(server ms, concurrency, rows) per table; each table's first row is Envoy alone."""
    keys = sorted({(r.get("server_ms", 0.0), r["concurrency"]) for r in rows})
    return [
        (ms, c, [r for r in rows if (r.get("server_ms", 0.0), r["concurrency"]) == (ms, c)])
        for ms, c in keys
    ]


def cpu_bound_ms(row: dict[str, Any], cores: int) -> float:
    """The latency a saturated closed loop predicts: each of ``concurrency`` requests
    waits for everyone's CPU, on the cores other work leaves to this run."""
    cpu_us = sum(row[f"{k}_cpu_us_per_req"] for k in ("envoy", "sims", "client"))
    cpu_us += row.get("epp_cpu_us_per_req", 0.0)
    free = max(cores - row["other_cores"], 0.1)
    return float(row["concurrency"]) * cpu_us / free / 1000


def reading(rows: list[dict[str, Any]], cores: int) -> list[str]:
    """How to read the tables, from their own numbers. With servers that take time the
    machine has room to spare, so *added* is the EPP path's own latency (set against
    the target). A saturated closed loop is CPU-bound instead: latency ~ concurrency x
    CPU per request (every process of the run) / the cores left by other work, so the
    EPP's added latency is mostly the CPU it and Envoy add, paid by every request."""
    lines = ["## Reading", ""]
    for server_ms, c, cell in cells(rows):
        base, paths = cell[0], cell[1:]
        busy = max(r["machine_busy"] for r in cell)
        own = max(r["machine_busy"] * cores - r["other_cores"] for r in cell)
        head = (
            f"- **Concurrency {c}, "
            + ("instant servers" if server_ms == 0 else f"servers taking {server_ms:g} ms")
            + f"** (machine {busy:.0%} busy at most; this run's processes used up to "
            f"{own:.1f} of {cores} cores): "
        )
        if server_ms > 0 or c <= cores or busy < SATURATED:  # not a CPU-bound loop
            added = [
                (r["path"], r["p50_ms"] - base["p50_ms"], r["p99_ms"] - base["p99_ms"],
                 max(r["other_cores"], base["other_cores"]) > BUSY_NEIGHBOURS)
                for r in paths
            ]  # fmt: skip
            met = sum(a[1] <= TARGET_ADDED_MS and a[2] <= TARGET_ADDED_MS for a in added)
            lines.append(
                head + "the run leaves CPU to spare, so *added* is each path's own latency "
                "(p50 / p99): "
                + "; ".join(
                    f"{name} {p50:+.1f} / {p99:+.1f} ms{'*' if noisy else ''}"
                    for name, p50, p99, noisy in added
                )
                + f". Within the ≤ {TARGET_ADDED_MS:g} ms target at both: "
                f"{met} of {len(added)} paths."
                + (
                    f" (* other work took > {BUSY_NEIGHBOURS:g} cores during this cell or "
                    "Envoy alone's: its numbers include that queueing.)"
                    if any(a[3] for a in added)
                    else ""
                )
            )
            continue
        predicted_base = cpu_bound_ms(base, cores)
        lines.append(
            head + f"CPU-bound. Predicted p50 = {c} x CPU per request of all the run's "
            f"processes / the {cores} cores less other work; Envoy alone "
            f"{predicted_base:.0f} predicted vs {base['p50_ms']:.0f} ms measured. "
            "Added p50, predicted vs measured: "
            + "; ".join(
                f"{r['path']} {cpu_bound_ms(r, cores) - predicted_base:+.0f} vs "
                f"{r['p50_ms'] - base['p50_ms']:+.0f} ms"
                for r in paths
            )
            + "."
        )
    lines.append("")
    return lines


if __name__ == "__main__":
    raise SystemExit(main())
