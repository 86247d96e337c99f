"""Prefill/decode split against the same servers aggregated: TTFT, ITL, e2e, throughput.

Run: ``.venv/bin/python -m bench.pd`` (the full matrix, ~1.5 hours) or ``--quick`` (a
short run, ~20 minutes); ``make bench-pd`` runs the full one. Writes
bench/results/pd.{md,json} (``--quick``: pd-short.*) and plots of ITL, TTFT and goodput
against load (``_itl.png``, ``_ttft.png``, ``_goodput.png``).

What runs. ``--servers`` (4) simulated servers with the same pinned settings
(``SIM_ARGS``: step-level batching with chunked prefill, so a long prefill slows the
decodes beside it; bench.routing pins the opposite), deployed as

* ``aggregated``: all of them mixed (each prefills and decodes its own requests; the
  EPP's decider is ``never``);
* ``PP:DD`` (``--ratios``, e.g. 1:3 and 2:2): P prefill-only and D decode-only servers,
  for each coordinator in ``--coordinators`` (nixl, sidecar), with the decider
  ``always``: every request's prefill runs on a prefill server, its KV moves to the
  decode server at the simulator's transfer cost;
* the decider comparison (``--deciders``, at ``--decider-ratio`` with ``nixl``):
  always, never, prefix-based and benefit on the same split pool (``benefit:W``: benefit
  with ``stallWeight`` W, to sweep the TTFT it trades for ITL);
* with ``--defer-decode on`` (or ``both``: beside the others), the splits of the
  coordinators that can defer (nixl, kv-pool) pick their decode server after the
  prefill leg (``disaggregation.deferDecode``; named ``... deferred``).

Each deployment is fresh and runs every workload in turn (``WORKLOADS``: prefill-heavy,
decode-heavy, mixed; every prompt unique, so no prefix cache helps), each after a short
unmeasured warm-up, at each load level (``--loads``, fractions of the aggregated pool's
estimated capacity for that workload, :func:`capacity`), in increasing order. Every
deployment sees exactly the same requests at the same times (seeded Poisson arrivals,
open loop, streamed completions through Envoy in ``lean`` mode, the EPP out of the
response path).

Per request: TTFT from its scheduled arrival to the first token, the gaps between its
tokens as they arrive (ITL; tokens that arrive in the same read count as a 0 gap), e2e
to the end of the stream. Latencies are reported in simulated milliseconds (wall time /
``--time-scale``). *Goodput*: the share of a cell's requests that succeed with TTFT
<= ``--slo-ttft-ms`` and their own p90 ITL <= ``--slo-itl-ms`` (1,500 and 50 ms,
chosen before any run: a chat user's patience for the first token, and 3x a decode-only
step of a full batch).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import math
import random
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from bench import pd_report
from bench.host import git_state, machine_cpu, machine_description
from bench.routing import cancel_late, client_session, pct
from epp.scheduling import defaults
from epp_harness.procs import scratch_dir
from epp_harness.stack import LocalStack, StackOptions

RESULTS = Path(__file__).resolve().parent / "results"
MODEL = "sim-model"

# Every `epp sim` flag that moves latency, pinned (in simulated ms; --time-scale apart).
SIM = {
    "max-num-seqs": 16,
    "kv-blocks": 100_000,  # no KV pressure: this benchmark is about compute, not caching
    "block-size": 16,
    "prefill-overhead-ms": 5.0,
    "prefill-ms-per-token": 0.05,
    "decode-ms-per-token": 8.0,
    "itl-ms-per-running-seq": 0.5,
    "max-num-batched-tokens": 2048,
    "kv-transfer-ms-per-token": 0.005,
}


@dataclass(frozen=True)
class Workload:
    """Requests drawn as (share, prompt token range, output token range) classes."""

    name: str
    classes: tuple[tuple[float, tuple[int, int], tuple[int, int]], ...]

    def mean_prompt(self) -> float:
        return sum(share * (lo + hi) / 2 for share, (lo, hi), _ in self.classes)

    def mean_output(self) -> float:
        return sum(share * (lo + hi) / 2 for share, _, (lo, hi) in self.classes)


WORKLOADS = (
    Workload("prefill-heavy", ((1.0, (3000, 6000), (8, 24)),)),
    Workload("decode-heavy", ((1.0, (100, 300), (150, 300)),)),
    Workload("mixed", ((0.25, (3000, 6000), (32, 64)), (0.75, (200, 600), (64, 160)))),
)


@dataclass(frozen=True)
class Deployment:
    name: str
    prefill: int  # 0: aggregated
    decode: int
    coordinator: str
    decider: str
    defer: bool = False  # disaggregation.deferDecode


def capacity(wl: Workload, servers: int) -> float:
    """Requests/s the aggregated pool completes with every slot busy (simulated time):
    each request's prefill compute plus its share of the decode steps of a full batch."""
    seqs = SIM["max-num-seqs"]
    step_ms = SIM["decode-ms-per-token"] + SIM["itl-ms-per-running-seq"] * seqs
    ms = (
        SIM["prefill-overhead-ms"]
        + SIM["prefill-ms-per-token"] * wl.mean_prompt()
        + wl.mean_output() * step_ms / seqs
    )
    return servers * 1000 / ms


@dataclass(slots=True)
class Planned:
    offset_s: float  # wall seconds after the cell starts
    prompt_tokens: int
    max_tokens: int
    data: bytes


def plan(wl: Workload, rate: float, duration: float, seed: int) -> list[Planned]:
    """Poisson arrivals at ``rate`` (wall req/s) for ``duration`` wall seconds."""
    rng = random.Random(seed)
    out: list[Planned] = []
    t = rng.expovariate(rate)
    while t < duration:
        share = rng.random()
        chosen = wl.classes[-1]
        for klass in wl.classes:
            share -= klass[0]
            if share <= 0:
                chosen = klass
                break
        prompt = rng.randint(*chosen[1])
        output = rng.randint(*chosen[2])
        tag = f"{seed}-{len(out)}-{rng.getrandbits(48):012x} "
        text = tag + "w" * max(0, 4 * prompt - len(tag))
        body = {
            "model": MODEL,
            "prompt": text,
            "max_tokens": output,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        out.append(Planned(t, prompt, output, orjson.dumps(body)))
        t += rng.expovariate(rate)
    return out


@dataclass(slots=True)
class Record:
    max_tokens: int
    due: float = 0.0
    ttft_s: float | None = None
    e2e_s: float | None = None
    gaps_s: list[float] = field(default_factory=list)
    tokens: int = 0
    error: str | None = None


async def one_request(session: aiohttp.ClientSession, url: str, p: Planned, rec: Record) -> None:
    loop = asyncio.get_running_loop()
    try:
        async with session.post(
            url, data=p.data, headers={"content-type": "application/json"}
        ) as r:
            if r.status != 200:
                await r.read()
                rec.error = f"http-{r.status}"
                return
            pending, last = b"", None
            async for chunk in r.content.iter_any():
                now = loop.time()
                pending += chunk
                *events, pending = pending.split(b"\n\n")
                for event in events:
                    if not event.startswith(b"data: {") or b'"text":""' in event:
                        continue
                    if b'"choices":[]' in event:  # the usage chunk
                        continue
                    rec.tokens += 1
                    if last is None:
                        rec.ttft_s = now - rec.due
                    else:
                        rec.gaps_s.append(now - last)
                    last = now
            rec.e2e_s = loop.time() - rec.due
        if rec.tokens != rec.max_tokens:
            rec.error = "short"
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        rec.error = type(exc).__name__


async def run_cell(
    session: aiohttp.ClientSession, url: str, requests: list[Planned], duration: float, drain: float
) -> list[Record]:
    loop = asyncio.get_running_loop()
    start = loop.time() + 0.05
    records: list[Record] = []
    tasks = []
    for p in requests:
        due = start + p.offset_s
        if (delay := due - loop.time()) > 0:
            await asyncio.sleep(delay)
        rec = Record(p.max_tokens, due)
        records.append(rec)
        tasks.append(loop.create_task(one_request(session, url, p, rec)))
    await cancel_late(tasks, records, start + duration + drain)
    return records


def epp_config(decider: str, time_scale: float, defer: bool = False) -> dict[str, Any]:
    """The built-in plugins and profiles with ``decider``, and latency priors matching the
    simulators (wall ms), which the ``benefit`` decider prices with until it has learned;
    ``defer``: the decode pick after the prefill leg."""
    plugins = copy.deepcopy(list(defaults.PLUGINS))
    for plugin in plugins:
        if plugin["type"] == "pd-profile-handler":
            params = plugin.setdefault("parameters", {})
            name, _, stall_weight = decider.partition(":")
            params["decider"] = name
            if name == "benefit":
                params["stepTokens"] = SIM["max-num-batched-tokens"]
                params["transferMsPerToken"] = SIM["kv-transfer-ms-per-token"] * time_scale
                if stall_weight:
                    params["stallWeight"] = float(stall_weight)
    return {
        "plugins": plugins,
        "schedulingProfiles": list(defaults.PROFILES),
        "disaggregation": {"deferDecode": defer},
        "latencyModel": {
            "overheadMs": SIM["prefill-overhead-ms"] * time_scale,
            "prefillMsPerToken": SIM["prefill-ms-per-token"] * time_scale,
            "decodeMsPerToken": SIM["decode-ms-per-token"] * time_scale,
            "decodeMsPerRunning": SIM["itl-ms-per-running-seq"] * time_scale,
            "maxNumSeqs": SIM["max-num-seqs"],
        },
    }


def stack_options(dep: Deployment, servers: int, time_scale: float, workdir: Path) -> StackOptions:
    config = workdir / "epp.yaml"
    config.write_text(json.dumps(epp_config(dep.decider, time_scale, dep.defer)))  # YAML
    sim_args = [f"--{k}={v}" for k, v in SIM.items()] + [f"--time-scale={time_scale}"]
    return StackOptions(
        servers=servers if not dep.prefill else 0,
        prefill=dep.prefill,
        decode=dep.decode,
        coordinator=dep.coordinator,
        envoy_port=0,
        envoy_admin_port=0,
        grpc_port=0,
        http_port=0,
        processing="lean",
        sim_args=sim_args,
        epp_args=["--config", str(config)],
        log_level="warning",
        workdir=workdir,
        envoy_concurrency=1,
    )


async def counters(session: aiohttp.ClientSession, stack: LocalStack) -> dict[str, float]:
    """Summed simulator counters and the EPP's P/D decisions."""
    out: dict[str, float] = {}
    for url in stack.sim_urls:
        async with session.get(f"{url}/sim/stats") as resp:
            stats = await resp.json()
        for key in ("kv_transfers", "local_prefills", "prefill_legs", "recomputed_prefills"):
            out[key] = out.get(key, 0) + stats.get(key, 0)
    async with session.get(f"{stack.epp_http_url}/metrics") as resp:
        text = await resp.text()
    for line in text.splitlines():
        if line.startswith("epp_pd_decisions_total{"):
            decision = line.split('decision="', 1)[1].split('"', 1)[0]
            out[f"decision:{decision}"] = float(line.rsplit(" ", 1)[1])
    return out


def summarize(
    records: list[Record], duration: float, scale: float, slo_ttft_ms: float, slo_itl_ms: float
) -> dict[str, Any]:
    ok = [r for r in records if r.error is None]
    ms = 1000 / scale  # wall seconds -> simulated ms
    ttft = sorted(r.ttft_s * ms for r in ok if r.ttft_s is not None)
    e2e = sorted(r.e2e_s * ms for r in ok if r.e2e_s is not None)
    itl = sorted(g * ms for r in ok for g in r.gaps_s)
    good = 0
    for r in ok:
        gaps = sorted(g * ms for g in r.gaps_s)
        own_p90 = pct(gaps, 0.9) if gaps else 0.0
        if r.ttft_s is not None and r.ttft_s * ms <= slo_ttft_ms and own_p90 <= slo_itl_ms:
            good += 1
    errors: dict[str, int] = {}
    for r in records:
        if r.error is not None:
            errors[r.error] = errors.get(r.error, 0) + 1
    row: dict[str, Any] = {"requests": len(records), "ok": len(ok), "errors": errors}
    for name, values in (("ttft", ttft), ("itl", itl), ("e2e", e2e)):
        for p in (50, 90, 99):
            v = pct(values, p / 100)
            row[f"{name}_p{p}_ms"] = None if math.isnan(v) else round(v, 1)
    sim_s = duration * scale
    row["throughput_rps"] = round(len(ok) / sim_s, 2)
    row["output_tokens_per_s"] = round(sum(r.tokens for r in ok) / sim_s, 1)
    row["goodput"] = round(good / len(records), 3) if records else None
    return row


async def run_deployment(
    dep: Deployment, args: argparse.Namespace, workdir: Path
) -> list[dict[str, Any]]:
    rows = []
    opts = stack_options(dep, args.servers, args.time_scale, workdir)
    with LocalStack(opts) as stack:
        url = f"{stack.envoy_url}/v1/completions"
        async with client_session() as session:
            for wi, wl in enumerate(WORKLOADS):
                if wl.name not in args.workloads:
                    continue
                cap = capacity(wl, args.servers) / args.time_scale  # wall req/s
                warm = plan(wl, args.loads[0] * cap, args.warmup, seed=1000 + wi)
                await run_cell(session, url, warm, args.warmup, args.drain)
                for li, load in enumerate(args.loads):
                    rate = load * cap
                    requests = plan(wl, rate, args.duration, seed=wi * 100 + li)
                    c0, cpu0 = await counters(session, stack), machine_cpu()
                    records = await run_cell(session, url, requests, args.duration, args.drain)
                    c1, cpu1 = await counters(session, stack), machine_cpu()
                    row = summarize(
                        records, args.duration, args.time_scale, args.slo_ttft_ms, args.slo_itl_ms
                    )
                    row |= {
                        "deployment": dep.name,
                        "workload": wl.name,
                        "load": load,
                        "rate_rps": round(rate * args.time_scale, 2),
                        "counters": {k: c1.get(k, 0) - c0.get(k, 0) for k in c1},
                        "machine_cpu": round(
                            100 * (cpu1[0] - cpu0[0]) / max(cpu1[1] - cpu0[1], 1), 1
                        ),
                    }
                    rows.append(row)
                    print(
                        f"  {dep.name:>22} {wl.name:>13} load {load:.2f}: "
                        f"TTFT p90 {row['ttft_p90_ms']} ITL p99 {row['itl_p99_ms']} "
                        f"e2e p90 {row['e2e_p90_ms']} ms, {row['throughput_rps']} req/s, "
                        f"goodput {row['goodput']}, errors {row['errors']}, "
                        f"CPU {row['machine_cpu']}%",
                        flush=True,
                    )
    return rows


def deployments(args: argparse.Namespace) -> list[Deployment]:
    deps = [Deployment("aggregated", 0, 0, "nixl", "never")]
    for ratio in args.ratios:
        p, d = (int(x) for x in ratio.split(":"))
        for coordinator in args.coordinators:
            name = f"{p}P:{d}D {coordinator}"
            if args.defer_decode != "on" or coordinator not in DEFERRING:
                deps.append(Deployment(name, p, d, coordinator, "always"))
            if args.defer_decode != "off" and coordinator in DEFERRING:
                deps.append(Deployment(f"{name} deferred", p, d, coordinator, "always", True))
    p, d = (int(x) for x in args.decider_ratio.split(":"))
    for decider in args.deciders:
        name = f"{p}P:{d}D nixl {decider}"
        if decider == "always" and f"{p}:{d}" in args.ratios and "nixl" in args.coordinators:
            continue  # already in the ratio comparison
        deps.append(Deployment(name, p, d, "nixl", decider))
    return deps


# the coordinators that can pick the decode endpoint after the prefill leg
DEFERRING = ("nixl", "kv-pool")


def decider(text: str) -> str:
    name, sep, weight = text.partition(":")
    if name not in DECIDERS or (sep and name != "benefit"):
        raise argparse.ArgumentTypeError(
            f"expected one of {', '.join(DECIDERS)} or benefit:W (W: its stallWeight), got {text!r}"
        )
    try:
        if sep and float(weight) < 0:
            raise ValueError
    except ValueError:
        raise argparse.ArgumentTypeError(f"benefit:W needs a number W >= 0, got {text!r}") from None
    return text


DECIDERS = ("always", "never", "prefix-based", "benefit")


def ratio(text: str) -> str:
    p, sep, d = text.partition(":")
    if not sep or not p.isdigit() or not d.isdigit() or int(p) < 1 or int(d) < 1:
        raise argparse.ArgumentTypeError(f"expected P:D (e.g. 1:3), got {text!r}")
    return text


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.pd",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = p.add_argument
    add("--quick", action="store_true", help="the short run (what --name pd-short records)")
    add("--servers", type=int, default=4, help="simulators in every deployment")
    add("--ratios", type=ratio, nargs="+", default=["1:3", "2:2"], help="P:D splits")
    add("--coordinators", nargs="+", default=["nixl", "sidecar"], help="for the splits")
    add(
        "--deciders",
        type=decider,
        nargs="+",
        default=list(DECIDERS),
        help="benefit:W runs benefit with stallWeight W (a sweep of its TTFT/ITL trade)",
    )
    add("--decider-ratio", type=ratio, default="1:3", help="the split the deciders run on")
    add(
        "--defer-decode",
        choices=["off", "on", "both"],
        default="off",
        help="the splits' decode pick after the prefill leg (nixl, kv-pool); both: each way",
    )
    add("--workloads", nargs="+", default=[w.name for w in WORKLOADS])
    add("--loads", type=float, nargs="+", default=[0.3, 0.5, 0.7, 0.85, 1.0, 1.15])
    add("--duration", type=float, default=20.0, help="wall seconds of arrivals per cell")
    add("--warmup", type=float, default=3.0, help="unmeasured wall seconds per workload")
    add("--drain", type=float, default=30.0, help="wall seconds to finish after arrivals")
    add("--time-scale", type=float, default=1.0, help="the simulators' --time-scale")
    add("--slo-ttft-ms", type=float, default=1500.0)
    add("--slo-itl-ms", type=float, default=50.0)
    add("--name", default=None, help="result file name (default pd, or pd-short)")
    add("--out", type=Path, default=RESULTS)
    add("--label", default="", help="a note for the report (e.g. where it ran)")
    return p


QUICK = {"loads": [0.4, 0.7, 1.0], "duration": 8.0, "warmup": 2.0, "drain": 12.0}


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.quick:
        for key, value in QUICK.items():
            if getattr(args, key) == parser.get_default(key):
                setattr(args, key, value)
    name = args.name or ("pd-short" if args.quick else "pd")
    started = time.time()
    rows: list[dict[str, Any]] = []
    deps = deployments(args)
    for dep in deps:
        print(f"{dep.name}: {dep.prefill or args.servers} + {dep.decode} servers", flush=True)
        workdir = scratch_dir("bench-pd-")
        rows += asyncio.run(run_deployment(dep, args, workdir))
    meta = {
        "name": name,
        "quick": args.quick,
        "command": shlex.join(
            ["python", "-m", "bench.pd", *(sys.argv[1:] if argv is None else argv)]
        ),
        "label": args.label,
        "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
        "minutes": round((time.time() - started) / 60, 1),
        "machine": machine_description(),
        "git": git_state(),
        "servers": args.servers,
        "sim": SIM,
        "time_scale": args.time_scale,
        "loads": args.loads,
        "duration_s": args.duration,
        "slo": {"ttft_ms": args.slo_ttft_ms, "itl_ms": args.slo_itl_ms},
        "workloads": {w.name: [list(c) for c in w.classes] for w in WORKLOADS},
        "capacity_rps": {w.name: round(capacity(w, args.servers), 2) for w in WORKLOADS},
        "deployments": [d.__dict__ for d in deps],
        "decider_ratio": args.decider_ratio,
    }
    pd_report.write(args.out, name, meta, rows)
    print(f"wrote {args.out / name}.md", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
