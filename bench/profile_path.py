"""Where the EPP's CPU goes on the request path, as shares: a sampled profile of
``epp serve`` under a closed-loop load through Envoy (as bench/overhead.py drives it: 4
instant simulators, Envoy's ext_proc filter in ``full`` mode, keep-alive clients, 1 KB
completions answered in one piece or streamed in ``--stream-chunks`` SSE chunks), and a
cProfile of the in-process exchange of bench/request_path.py (its router alone, and
through the native transport with no socket).

The served EPP is sampled by py-spy (``--native``: C frames too, so the event loop's
socket work and protobuf's C code count where they run), attached for ``--duration``
seconds while the load runs (100 samples a second), so start-up is left out; each
sample goes to one part of the path by its innermost frame that names a part
(:func:`sampled_part`; the interpreter's and libc's own frames count for the code
around them). Without py-spy on
the PATH (``pip install py-spy``), ``--sampler cprofile`` profiles the served EPP with
cProfile between two signals instead; that sees no C code the event loop runs outside
Python callbacks (its socket work), so its shares leave the sockets out. In process,
each function's own time (cProfile's *tottime*) goes to its part, a C function's to its
caller's unless its name says protobuf. cProfile charges every Python call some
overhead of its own, so code made of many small calls weighs more in its shares than it
costs unprofiled: read shares as where to look, and bench/results' overhead files for
figures.

    python -m bench.profile_path [--transports native grpclib] [--concurrency 32]
        [--duration 10] [--stream-chunks 64] [--requests 300] [--note TEXT] [--write]

``--write`` writes bench/results/profile-request-path.{md,json}.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import re
import runpy
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench import overhead
from bench.host import git_state, machine_description
from bench.request_path import profile_stats
from bench.result_files import run_header, write_pair
from epp_harness.envoyconfig import EnvoyOptions, epp_config
from epp_harness.procs import ManagedProcess
from epp_harness.stack import LocalStack, StackOptions

RESULTS = Path(__file__).resolve().parent / "results"

# (part, its files: path fragments, the first match wins)
_FILES: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "transport",
        (
            "/epp/extproc/native/",
            "/epp/extproc/driver.py",
            "/epp/extproc/grpclib_transport.py",
            "/epp/extproc/grpcio_transport.py",
            "/epp/extproc/h2frames.py",
            "/grpclib/",
            "/h2/",
            "/hpack/",
            "/hyperframe/",
            "/multidict/",
            "/grpc/",
        ),
    ),
    ("protobuf", ("/google/protobuf/", "/epp/extproc/messages.py", "_pb2.py")),
    ("state machine", ("/epp/extproc/",)),
    (
        "parsing",
        (
            "/epp/common/requestparse.py",
            "/epp/common/apis/",
            "/epp/common/usage.py",
            "/epp/common/tokenization.py",
            "/json/",
        ),
    ),
    ("latency model", ("/epp/scheduling/latency.py", "/epp/scheduling/plugins/latency.py")),
    (
        "scheduling",
        (
            "/epp/scheduling/",
            "/epp/datastore.py",
            "/epp/flowcontrol/",
            "/epp/lora/",
            "/epp/disagg/",
            "/epp/modelnames.py",
            "/epp/types.py",
            "/epp/lifecycle/admission.py",
            "/epp/lifecycle/picking.py",
            "/epp/lifecycle/resolving.py",
            "/epp/lifecycle/handoff.py",
        ),
    ),
    (
        "metrics",
        (
            "/epp/observability/metrics.py",
            "/epp/observability/families.py",
            "/epp/observability/llmdmetrics.py",
            "/prometheus_client/",
        ),
    ),
    ("observers", ("/epp/lifecycle/", "/epp/router.py", "/epp/observability/")),
    ("event loop", ("/uvloop/", "/asyncio/", "selectors.py", "socket.py", "ssl.py", "_asyncio")),
    ("logging", ("/logging/",)),
    ("background", ("/epp/datalayer/", "/aiohttp/", "/epp/xds/", "/epp/admin/", "/yarl/")),
)
PARTS = (
    "transport", "protobuf", "state machine", "parsing", "scheduling", "latency model",
    "observers", "metrics", "event loop", "logging", "background", "other",
)  # fmt: skip
# the lifecycle's parts: what the request path does besides carrying messages
LIFECYCLE = ("state machine", "parsing", "scheduling", "latency model", "observers", "metrics")
# C functions whose own part their name tells (the rest count for their caller's part)
_C_NAMES = (
    ("protobuf", ("SerializeToString", "FromString", "ParseFromString", "HasField",
                  "WhichOneof", "ListFields", "MergeFrom", "CopyFrom", "_upb", "_message")),
    ("event loop", ("uvloop", "_asyncio", "select.epoll", "_socket", "_ssl")),
    ("parsing", ("orjson", "_json")),
)  # fmt: skip

Func = tuple[str, int, str]
# C code whose part its file or function name tells (py-spy --native frames)
_NATIVE = (
    ("event loop", ("uvloop", ".pyx", "uv__", "uv_", "libuv", "epoll", "_asyncio")),
    ("protobuf", ("upb", "protobuf", "_message")),
    ("parsing", ("orjson", "_json")),
    ("transport", ("hpack",)),
)
_PYSPY_FRAME = re.compile(r"^(?P<name>.*?) \((?P<file>[^()]*?)(?::\d+)?\)$")


def part(func: Func) -> str | None:
    """The part of the path a function's own time goes to (None: a C function that
    counts for its caller)."""
    file, _, name = func
    if file == "~":
        for found, names in _C_NAMES:
            if any(n in name for n in names):
                return found
        return None
    for found, fragments in _FILES:
        if any(f in file for f in fragments):
            return found
    return "other"


def sampled_part(frames: list[tuple[str, str]]) -> str:
    """The part a py-spy sample goes to: its innermost frame (the last of ``frames``,
    each (file, name); py-spy names a Python file relative to its package root) that
    names a part: a Python file by :func:`part`, C code by its library's or source's
    name (:data:`_NATIVE`); other C code (the interpreter, libc) counts for the code
    around it."""
    for file, name in reversed(frames):
        if file.endswith(".py"):
            found = part(("/" + file.lstrip("/"), 0, name))
            if found is not None:
                return found
            continue
        where = f"{file} {name}"
        for found, fragments in _NATIVE:
            if any(f in where for f in fragments):
                return found
    return "other"


def sampled_shares(raw: str) -> dict[str, float]:
    """Each part's share of a py-spy ``--format raw`` profile's samples."""
    counts: Counter[str] = Counter()
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = []
        for text in stack.split(";"):
            match = _PYSPY_FRAME.match(text)
            if match:
                frames.append((match["file"], match["name"]))
        counts[sampled_part(frames)] += int(count)
    total = sum(counts.values()) or 1
    return {name: counts[name] / total for name in PARTS}


def shares(stats: pstats.Stats) -> dict[str, float]:
    """Each part's share of the profile's own time (a C function's split among its
    callers as cProfile counted them)."""
    table: dict[Func, Any] = stats.stats  # type: ignore[attr-defined]
    seconds = dict.fromkeys(PARTS, 0.0)

    def owner(func: Func, seen: frozenset[Func] = frozenset()) -> str:
        found = part(func)
        if found is not None:
            return found
        callers = table.get(func, (0, 0, 0.0, 0.0, {}))[4]
        if not callers or func in seen:
            return "other"
        # a C function called by a C function: its first Python caller's part
        return owner(next(iter(callers)), seen | {func})

    for func, (_, _, own, _, callers) in table.items():
        found = part(func)
        if found is not None or not callers:
            seconds[found or "other"] += own
            continue
        for caller, (_, _, caller_own, _) in callers.items():
            seconds[owner(caller)] += caller_own
    total = sum(seconds.values()) or 1.0
    return {name: value / total for name, value in seconds.items()}


# -- the served EPP --------------------------------------------------------------------


def profiled_serve(out: str, argv: list[str]) -> None:
    """``epp serve ARGV`` with a profiler that SIGUSR1 starts and SIGUSR2 stops and
    writes to ``out`` (the child the served profile runs)."""
    profiler = cProfile.Profile()

    def start(*_: object) -> None:
        profiler.enable()

    def stop(*_: object) -> None:
        profiler.disable()
        profiler.dump_stats(out)
        Path(out + ".done").touch()

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)
    sys.argv = ["epp", *argv]
    runpy.run_module("epp", run_name="__main__", alter_sys=True)


def served(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Shares per (transport, workload) of ``epp serve`` under Envoy."""
    overhead.write_bodies(1000, 0)  # one token in one piece
    overhead.write_bodies(1000, args.stream_chunks)
    concurrency = args.concurrency
    opts = StackOptions(
        servers=4, envoy_port=0, envoy_admin_port=0, grpc_port=0, http_port=0,
        sim_args=overhead.sim_args(0, 1000, concurrency, overhead.TOKEN_MS),
        epp=False, log_level="warning",
    )  # fmt: skip
    results: dict[str, dict[str, float]] = {}
    with LocalStack(opts) as stack:
        for transport in args.transports:
            for chunks in (0, args.stream_chunks):
                name = f"{transport}-{'streamed' if chunks else 'plain'}"
                print(f"  {name} ...", end="", flush=True)
                results[f"served {name}"] = _served_one(stack, transport, chunks, args)
                print(" done", flush=True)
    return results


def _served_one(
    stack: LocalStack, transport: str, chunks: int, args: argparse.Namespace
) -> dict[str, float]:
    workdir = stack.workdir
    name = f"profile-{transport}-{chunks}"
    out = workdir / f"{name}.prof"
    ready = workdir / f"{name}.ready"
    flags = [*overhead.serve_flags(transport, stack.sim_addresses), "--ready-file", str(ready)]
    if args.sampler == "cprofile":
        code = "import sys; from bench.profile_path import profiled_serve; "
        code += "profiled_serve(sys.argv[1], sys.argv[2:])"
        argv = [sys.executable, "-c", code, str(out), "serve", *flags]
    else:
        argv = [sys.executable, "-m", "epp", "serve", *flags]
    epp = ManagedProcess(name, argv, ready_file=ready, log_path=workdir / f"{name}.log")
    epp.start()
    envoy = None
    try:
        epp.wait_ready()
        assert epp.proc is not None
        config = epp_config(
            EnvoyOptions(listen_port=0, admin_port=0, epp_port=epp.info["grpc_port"])
        )
        envoy = overhead.start_envoy(stack, name, config)
        url = f"http://127.0.0.1:{envoy.port}/v1/completions"
        body = overhead.body_file(chunks)
        _warm_up(url, args.concurrency, body)
        if args.sampler == "cprofile":
            os.kill(epp.proc.pid, signal.SIGUSR1)
            overhead.load(url, args.concurrency, args.duration, 0.0, body=body)
            os.kill(epp.proc.pid, signal.SIGUSR2)
            _wait_for(Path(str(out) + ".done"), name)
            return shares(pstats.Stats(str(out)))
        record = subprocess.Popen(
            ["py-spy", "record", "--native", "--format", "raw", "--rate", "100",
             "--duration", str(int(args.duration)), "--pid", str(epp.proc.pid), "-o", str(out)],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
        )  # fmt: skip
        overhead.load(url, args.concurrency, args.duration + 1.0, 0.0, body=body)
        if record.wait(timeout=60) != 0 or not out.exists():
            raise RuntimeError(f"{name}: py-spy failed (exit {record.returncode})")
        if args.keep is not None:
            args.keep.mkdir(parents=True, exist_ok=True)
            shutil.copy(out, args.keep / f"{name}.txt")
        return sampled_shares(out.read_text())
    finally:
        if envoy is not None:
            envoy.stop()
        epp.stop()


def _warm_up(url: str, concurrency: int, body: Path) -> None:
    """A second of load; tried again while Envoy has not yet taken the EPP's endpoints
    (its clients' connections cut)."""
    for attempt in range(10):
        try:
            overhead.load(url, concurrency, 1.0, 0.0, body=body)
            return
        except subprocess.CalledProcessError:
            if attempt == 9:
                raise
            time.sleep(0.5)


def _wait_for(done: Path, name: str) -> None:
    deadline = time.monotonic() + 60
    while not done.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name}: the profile was not written")
        time.sleep(0.1)


# -- in process ------------------------------------------------------------------------


def in_process(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Shares per kind of bench/request_path.py's exchanges (``native-``: through the
    native transport with no socket)."""
    results = {}
    for kind in ("plain", "streamed", "native-plain", "native-streamed"):
        print(f"  in process, {kind} ...", flush=True)
        stats = profile_stats(kind, 8, args.stream_chunks, args.requests)
        results[f"in process {kind}"] = shares(stats)
    return results


# -- the report ------------------------------------------------------------------------

_ROWS = {
    "served native-plain": "`epp serve --transport native` under Envoy, non-streamed",
    "served native-streamed": "`epp serve --transport native` under Envoy, streamed",
    "served grpclib-plain": "`epp serve --transport grpclib` under Envoy, non-streamed",
    "served grpclib-streamed": "`epp serve --transport grpclib` under Envoy, streamed",
    "in process plain": "in process, non-streamed (no transport)",
    "in process streamed": "in process, streamed (no transport)",
    "in process native-plain": "in process through the native transport, non-streamed",
    "in process native-streamed": "in process through the native transport, streamed",
}


def report(results: dict[str, dict[str, float]], sampler: str) -> str:
    used = [p for p in PARTS if any(r[p] >= 0.0005 for r in results.values())]
    head = ["profile", *used, "lifecycle in all"]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for key, row in results.items():
        how = f"{sampler}" if key.startswith("served") else "cProfile"
        cells = [f"{row[p]:.0%}" for p in used]
        lifecycle = sum(row[p] for p in LIFECYCLE)
        label = f"{_ROWS.get(key, key)} ({how})"
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {lifecycle:.0%} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--transports", nargs="+", default=["native", "grpclib"])
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--duration", type=float, default=10.0, help="seconds profiled per cell")
    parser.add_argument("--stream-chunks", type=int, default=64)
    parser.add_argument("--requests", type=int, default=300, help="in-process exchanges")
    parser.add_argument("--no-served", action="store_true", help="only the in-process profiles")
    parser.add_argument(
        "--sampler",
        choices=["py-spy", "cprofile"],
        default="py-spy" if shutil.which("py-spy") else "cprofile",
        help="how the served EPP is profiled (default: py-spy when it is on the PATH)",
    )
    parser.add_argument("--note", default="", help="a line the results file starts with")
    parser.add_argument("--keep", type=Path, help="copy the raw py-spy profiles here")
    parser.add_argument("--write", action="store_true", help="write bench/results/profile-*")
    args = parser.parse_args()
    started = time.monotonic()
    results = {} if args.no_served else served(args)
    results.update(in_process(args))
    table = report(results, args.sampler)
    print(table, end="")
    if args.write:
        meta = {
            "date": time.strftime("%Y-%m-%d"),
            "machine": machine_description(),
            "git": git_state(),
            "elapsed_s": time.monotonic() - started,
            "command": "python -m bench.profile_path " + " ".join(sys.argv[1:]),
            "note": args.note,
        }
        config = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
        doc: dict[str, Any] = {"meta": meta, "config": config}
        doc["shares"] = results
        text = "\n".join(run_header("Where the EPP's CPU goes (profile shares)", meta))
        write_pair(RESULTS, "profile-request-path", doc, text + "\n" + table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
