"""``make bench`` -> overhead: what the EPP adds on top of Envoy alone.

Side by side in one run, against the same simulators: Envoy with a static round-robin
cluster, and Envoy + EPP per processing mode, transport and event loop. Reports p50/p99
latency, req/s, CPU per request of the EPP and of Envoy, and how busy the machine was,
at each concurrency. Writes bench/results/overhead.{md,json} (``--name``).

``--server-ms`` sets how long the simulators take per completion; each value runs every
path again. With instant servers (0, the default) a closed loop saturates the machine,
so the tables show throughput and CPU per request; with realistic servers (e.g. 200 ms)
the machine has room to spare and the added latency is the EPP's own.

``--stream-chunks N`` measures every path twice: completions of N - 1 tokens answered
in one piece, and the same streamed (SSE: a chunk per token and one for the usage and
``[DONE]``, the simulators pacing tokens ``--token-ms`` apart so each chunk travels
alone); the EPP's CPU per chunk is the difference over the extra ext_proc messages
Envoy's counters show. ``--also-from CHECKOUT`` runs each EPP path on another
checkout's code too, with the flags its ``epp serve --help`` lists, and ``--repeats N``
measures every cell N times in turn (old, new, old, new ...): the tables hold the
medians, and the new/old ratio of EPP CPU per request is the median of the pairs'.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import orjson

from bench import overhead_ab, overhead_report, workers
from bench.host import cpu_seconds, git_state, machine_cpu, machine_description
from bench.overhead_report import PICKER, workload
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
CHARS_PER_TOKEN = 4  # the simulators' token estimate (epp_harness/sim/config.py)
# KV block size of simulators that take time: large blocks keep their own prefix-cache
# hashing (blake2b per block, ~3 ms per 220 KB prompt at 16 tokens) from loading the
# shared cores; with no per-token prefill cost, block size changes no latency.
SIM_BLOCK_TOKENS = 1024
# Clients of servers that take time pause a random time (this share of it on average)
# between requests: behind servers that all take exactly the same time, closed-loop
# clients otherwise move in lockstep and reach the EPP in bursts of `concurrency`.
THINK_SHARE = 0.5
BODIES = Path(tempfile.mkdtemp(prefix="epp-bench-"))
# with --stream-chunks, the simulators' pause between tokens when they take no time
# otherwise: long enough that each chunk reaches Envoy, and the EPP, on its own
TOKEN_MS = 1.0
# with --stream-chunks, how long each cell first measures the EPP with no request: at a
# few streams per second its scrapes would otherwise weigh on the CPU per request
IDLE_S = 1.0


def body_file(stream_chunks: int) -> Path:
    """The request body of a workload: ``stream_chunks`` 0, a one-token completion, or
    (:func:`write_bodies` with chunks) that many chunks' tokens, answered in one piece
    (-N) or streamed (N)."""
    return BODIES / f"body{stream_chunks}.json"


def workloads(stream_chunks: int) -> list[int]:
    """The rows' ``stream_chunks`` values (:func:`bench.overhead_report.workload`): 0, or
    when streaming the one-piece reference (-N) and the stream (N)."""
    return [-stream_chunks, stream_chunks] if stream_chunks else [0]


def write_bodies(prompt_bytes: int, stream_chunks: int) -> None:
    prompt = "x" * prompt_bytes
    for chunks in workloads(stream_chunks):
        # a stream's chunks: one per token, then the usage with [DONE] in one write
        tokens = abs(chunks) - 1 if chunks else 1
        body = {"model": "sim-model", "prompt": prompt, "max_tokens": tokens, "temperature": 0}
        if chunks > 0:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        body_file(chunks).write_bytes(orjson.dumps(body))


@dataclass
class Path_:
    name: str
    envoy: EnvoyProcess
    epp_pid: int | None
    # a worker row: how many (1: the plain process), and the group's HTTP port (2+)
    workers: int = 0
    http_port: int = 0


def serve_flags(key: str, addresses: list[str]) -> list[str]:
    """``epp serve``'s flags for the EPP process ``key`` (:func:`_epp_code`) on the
    servers at ``addresses``, as this checkout's CLI takes them."""
    flags, _ = _epp_code(key)
    endpoints = [a for addr in addresses for a in ("--endpoint", addr)]
    return [
        "--grpc-port", "0", "--http-port", "0", "--grpc-health-port", "0",
        "--log-level", "warning", *endpoints, *flags,
    ]  # fmt: skip


@functools.cache
def checkout_options(checkout: str) -> dict[str, frozenset[str] | None]:
    """The options of ``epp serve`` in another checkout, read from its ``--help``."""
    help_text = subprocess.run(
        [sys.executable, "-m", "epp", "serve", "--help"],
        capture_output=True, text=True, check=True,
        env={**os.environ, **_checkout_env(checkout)},
    ).stdout  # fmt: skip
    return overhead_ab.cli_options(help_text)


def adapted_flags(key: str, addresses: list[str]) -> tuple[list[str] | None, str]:
    """:func:`serve_flags` as the checkout ``key`` names takes them (None: it cannot run
    that path), and what was left out or why not."""
    flags = serve_flags(key, addresses)
    _, _, checkout = key.partition("@")
    if not checkout:
        return flags, ""
    return overhead_ab.adapt_argv(flags, checkout_options(checkout))


def spawn_picker(workdir: Path, addresses: list[str]) -> ManagedProcess:
    """Start the minimal picker (bench/minimal_picker.py) on the servers at
    ``addresses``; returns at once (call wait_ready())."""
    ready = workdir / f"{PICKER}.ready"
    endpoints = [a for addr in addresses for a in ("--endpoint", addr)]
    argv = [sys.executable, "-m", "bench.minimal_picker", "--grpc-port", "0", *endpoints]
    return ManagedProcess(
        PICKER,
        [*argv, "--ready-file", str(ready)],
        ready_file=ready,
        log_path=workdir / f"{PICKER}.log",
    ).start()


def spawn_epp_for(stack: LocalStack, key: str) -> ManagedProcess:
    """Start the EPP process ``key`` names (:func:`_epp_code`; ``picker``: the minimal
    picker) on the simulators; returns at once (call wait_ready())."""
    if key == PICKER:
        return spawn_picker(stack.workdir, stack.sim_addresses)
    flags, why = adapted_flags(key, stack.sim_addresses)
    assert flags is not None, f"{key}: {why} (runnable_on() leaves such paths out)"
    _, env = _epp_code(key)
    return spawn_epp(stack.workdir, _file_name(key), "serve", *flags, env=env)


def _file_name(key: str) -> str:
    return key.replace("/", "_")


def start_envoy(stack: LocalStack, name: str, config: dict[str, Any]) -> EnvoyProcess:
    workdir = stack.workdir / name
    workdir.mkdir(exist_ok=True)
    return EnvoyProcess(
        write_config(config, workdir / "envoy.yaml"), workdir, concurrency=1
    ).start()


def load(
    url: str,
    concurrency: int,
    duration: float,
    warmup: float,
    think_ms: float = 0.0,
    body: Path | None = None,
) -> dict[str, Any]:
    body = body or body_file(0)
    out = subprocess.run(
        [sys.executable, "-m", "bench.loadgen", "--url", url, "--body-file", str(body),
         "--concurrency", str(concurrency), "--duration", str(duration), "--warmup", str(warmup),
         "--think-ms", str(think_ms)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    result: dict[str, Any] = orjson.loads(out.stdout)
    return result


def extproc_messages(envoy: EnvoyProcess) -> float | None:
    """The messages Envoy's ext_proc filter has sent its processor so far (None: no
    ext_proc filter)."""
    url = f"{envoy.admin_url}/stats?filter=ext_proc.stream_msgs_sent"
    with urllib.request.urlopen(url, timeout=10) as reply:
        text = reply.read().decode()
    for line in text.splitlines():
        name, _, value = line.partition(": ")
        if name.endswith("ext_proc.stream_msgs_sent"):
            return float(value)
    return None


def measure(
    path: Path_,
    concurrency: int,
    duration: float,
    sim_pids: list[int],
    think_ms: float,
    body: Path | None = None,
    idle_s: float = 0.0,
) -> dict[str, Any]:
    """One cell; with ``idle_s``, first the EPP's CPU while no request runs (its scrapes
    and timers), per second."""
    url = f"http://127.0.0.1:{path.envoy.port}/v1/completions"
    # warm connections, caches, JIT-less Python paths
    load(url, concurrency, 1.0, 0.0, body=body)
    pids = {"envoy": [path.envoy.process.pid], "sims": sim_pids}
    if path.epp_pid:
        pids["epp"] = [path.epp_pid]
    group = workers.group(path.http_port) if path.workers > 1 else []
    if group:
        pids["epp"] += [w["pid"] for w in group]
    idle = idle_cpu_us_per_s(pids.get("epp", []), idle_s) if idle_s else None
    seen0 = [workers.requests_seen(w["http_port"]) for w in group]  # not in the CPU counted
    before = {k: sum(cpu_seconds(p) for p in ps) for k, ps in pids.items()}
    process_cpu0 = [cpu_seconds(p) for p in pids["epp"]] if path.workers else []
    client0 = children_cpu_seconds()
    messages0 = extproc_messages(path.envoy)
    busy0, total0 = machine_cpu()
    start = time.monotonic()
    result = load(url, concurrency, duration, 0.0, think_ms, body)
    wall = time.monotonic() - start
    busy1, total1 = machine_cpu()
    spent = {k: sum(cpu_seconds(p) for p in ps) - before[k] for k, ps in pids.items()}
    messages1 = extproc_messages(path.envoy)
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
    if messages0 is not None and messages1 is not None:
        # Envoy -> EPP messages per request (the load above counts every request it
        # sends: no warm-up)
        result["extproc_msgs_per_req"] = (messages1 - messages0) / n
    if idle is not None:
        result["epp_idle_cpu_us_per_s"] = idle
    result["path"], result["concurrency"] = path.name, concurrency
    return result


def idle_cpu_us_per_s(pids: list[int], seconds: float) -> float | None:
    """The CPU ``pids`` take per second while no request runs (None: no processes)."""
    if not pids:
        return None
    cpu0, began = sum(cpu_seconds(p) for p in pids), time.monotonic()
    time.sleep(seconds)
    return (sum(cpu_seconds(p) for p in pids) - cpu0) / (time.monotonic() - began) * 1e6


def children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def sim_args(
    server_ms: float, prompt_bytes: int, concurrency: int, token_ms: float = 0.0
) -> list[str]:
    """Simulator flags: answer instantly (0), or take ``server_ms`` per completion
    (and ``token_ms`` between tokens) however many requests run at once and wherever
    the EPP sends them (no queueing, KV for ``concurrency`` prompts on one server), so
    the servers add no latency of their own that differs between paths.

    Servers that take ``server_ms`` run per-request timing (``--max-num-batched-tokens
    0``): in the simulator's default steps each prefill that starts in a step adds
    ``--prefill-overhead-ms`` to that step, and a server runs one step at a time, so
    prefills queue behind each other: at most 1000 / ``server_ms`` of them a second per
    server (20 a second for 4 servers at 200 ms, which held Envoy alone's p50 at 800 ms
    with 220 KB prompts). Streams paced by ``token_ms`` alone keep the steps, whose
    tokens come out together as a batch's do."""
    if server_ms == 0 and token_ms == 0:
        return ["--time-scale", "0"]
    blocks_per_request = math.ceil(prompt_bytes / CHARS_PER_TOKEN / SIM_BLOCK_TOKENS) + 2
    per_request = ["--max-num-batched-tokens", "0"] if server_ms else []
    return [
        "--time-scale", "1", "--prefill-overhead-ms", f"{server_ms:g}",
        "--prefill-ms-per-token", "0", "--decode-ms-per-token", f"{token_ms:g}",
        "--itl-ms-per-running-seq", "0", *per_request, "--block-size", str(SIM_BLOCK_TOKENS),
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
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="measure every cell this many times in turn (with --also-from: old, new, old, "
        "new ...); the tables hold the medians",
    )
    parser.add_argument(
        "--stream-chunks",
        type=int,
        default=0,
        metavar="N",
        help="measure each path on completions of N - 1 tokens answered in one piece and "
        "streamed in N SSE chunks: the EPP's CPU per response chunk",
    )
    parser.add_argument(
        "--token-ms",
        type=float,
        default=TOKEN_MS,
        help="with --stream-chunks: the simulators' time between tokens",
    )
    args = parser.parse_args()
    if args.repeats < 1 or args.stream_chunks < 0 or args.stream_chunks == 1:
        parser.error("--repeats must be at least 1, --stream-chunks 0 or at least 2")
    write_bodies(args.prompt_bytes, args.stream_chunks)
    specs = chosen_paths(args.paths, args.also_from)
    left_out: dict[str, str] = {}
    if args.also_from is not None:
        specs, left_out = runnable_on(specs, args.also_from)
        for key, why in left_out.items():
            print(f"{key}: {why}", flush=True)
    rows = []
    for server_ms in args.server_ms:
        rows += run_paths(args, server_ms, specs)
    write_results(args.out, rows, args, left_out)
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
    PathSpec("picker", "minimal Python picker (grpcio, uvloop), full", PICKER),
]  # fmt: skip


def chosen_paths(keys: list[str] | None, also_from: Path | None) -> list[PathSpec]:
    """The baseline, then the chosen paths (all by default) in :data:`PATHS`' order;
    with ``also_from`` each EPP path (the picker is none) first on that checkout's code,
    then on this one's: old, new."""
    picked = [s for s in PATHS if keys is None or s.key in keys]
    out = [BASELINE]
    for spec in picked:
        if also_from is not None and spec.epp not in (None, PICKER):
            out.append(
                replace(
                    spec,
                    key=f"{spec.key}@{also_from.name}",
                    name=f"{spec.name} ({also_from.name})",
                    epp=f"{spec.epp}@{also_from.resolve()}",
                )
            )
        out.append(spec)
    return out


def runnable_on(specs: list[PathSpec], checkout: Path) -> tuple[list[PathSpec], dict[str, str]]:
    """``specs`` less the paths ``checkout``'s CLI cannot serve, and why each went (or
    which optional flags its paths run without)."""
    kept, notes = [], {}
    for spec in specs:
        if spec.epp is None or "@" not in spec.epp:
            kept.append(spec)
            continue
        flags, why = adapted_flags(spec.epp, ["127.0.0.1:1"])
        if flags is not None:
            kept.append(spec)
        if why:
            notes[spec.key] = why if flags is not None else f"not run: {why}"
    return kept, notes


def run_paths(
    args: argparse.Namespace, server_ms: float, specs: list[PathSpec]
) -> list[dict[str, Any]]:
    """``specs`` at every concurrency, ``args.repeats`` times in turn, against
    simulators taking ``server_ms``."""
    token_ms = args.token_ms if args.stream_chunks else 0.0
    opts = StackOptions(
        servers=args.servers, envoy_port=0, envoy_admin_port=0, grpc_port=0, http_port=0,
        sim_args=sim_args(server_ms, args.prompt_bytes, max(args.concurrency), token_ms),
        epp=False, log_level="warning",
    )  # fmt: skip
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
                ports = epp.info.get("grpc_ports", [])  # older checkouts: one port
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
            for c, repeat in itertools.product(args.concurrency, range(args.repeats)):
                for spec, path in zip(specs, paths, strict=True):
                    for chunks in workloads(args.stream_chunks):
                        print(f"  c={c:<3} {repeat + 1}/{args.repeats} {workload(chunks)} "
                              f"{path.name} ...", end="", flush=True)  # fmt: skip
                        row = measure(
                            path, c, args.duration, sim_pids, server_ms * THINK_SHARE,
                            body_file(chunks), IDLE_S if chunks else 0.0,
                        )  # fmt: skip
                        key, _, checkout = spec.key.partition("@")
                        row.update(server_ms=server_ms, stream_chunks=chunks, repeat=repeat)
                        row.update(key=key, side="old" if checkout else "new")
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
    return EPPS[name], _checkout_env(checkout)


def _checkout_env(checkout: str) -> dict[str, str]:
    return {"PYTHONPATH": checkout, "PYTHONSAFEPATH": "1"} if checkout else {}


def write_results(
    out: Path, runs: list[dict[str, Any]], args: argparse.Namespace, notes: dict[str, str]
) -> None:
    """``NAME.json`` (the medians as ``rows``, every measurement as ``runs``, the A/B
    ratios as ``ab``) and ``NAME.md``."""
    out.mkdir(parents=True, exist_ok=True)
    meta: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": machine_description(),
        "git": git_state(),
        "command": "python -m bench.overhead " + " ".join(sys.argv[1:]),
        "duration_s": args.duration,
        "servers": args.servers,
        "cores": os.cpu_count() or 1,
        "repeats": args.repeats,
        "prompt_bytes": args.prompt_bytes,
        "stream_chunks": args.stream_chunks,
    }
    if args.also_from is not None:
        meta["also_from"] = {"name": args.also_from.name, "git": checkout_commit(args.also_from)}
        meta["also_from_notes"] = notes
    rows = overhead_ab.median_rows(runs)
    ab = overhead_ab.cpu_ratios(runs)
    doc = {"meta": meta, "rows": rows, "runs": runs, "ab": ab}
    (out / f"{args.name}.json").write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    lines = overhead_report.markdown(meta, rows, ab)
    (out / f"{args.name}.md").write_text("\n".join(lines))
    print("\n".join(overhead_report.ab_lines(ab, rows)), flush=True)
    print(f"wrote {out / args.name}.md")


def checkout_commit(checkout: Path) -> str:
    """The commit another checkout has out (``unknown`` when it is no git checkout)."""
    try:
        return subprocess.run(
            ["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


if __name__ == "__main__":
    raise SystemExit(main())
