"""LoRA adapter churn: adapter loads per 100 requests and TTFT of round robin against the
EPP, with on-demand loading off and on.

Run: ``.venv/bin/python -m bench.lora`` (``make bench-lora``); ``--duration`` and
``--rate`` size it. Writes bench/results/NAME.{json,md} (``--name``, default ``lora``).

The workload: ``--adapters`` adapters (8) with Zipf popularity (``--zipf`` 1.1, adapter
i drawn with weight 1/(i+1)^s), Poisson arrivals at ``--rate`` requests/s, each a
streaming completion of ``--output-tokens`` tokens naming its adapter as ``model``. The
servers: ``--servers`` simulators (4), each with ``--max-loras`` adapter slots (2): an
adapter entering a full slot table evicts an idle one and costs ``--swap-ms`` (100); a
request whose adapter finds every slot busy with others waits (epp_harness.sim.lora).

The policies, each on fresh simulators, all seeing the same requests at the same times:

* ``round-robin``: Envoy alone, round robin; every adapter registered on every server.
* ``epp``: Envoy + the EPP's default config (LoRA affinity), every adapter registered
  everywhere, placement off.
* ``epp-on-demand``: no adapter registered anywhere; the EPP loads each on demand
  (``loraPlacement``: enabled, ``maxAdaptersPerServer`` = the slots, least recently
  used unloaded).

Adapter loads = slot swaps (an adapter evicting another on a server, counted by the
simulators) + runtime loads through ``/v1/load_lora_adapter``; per 100 measured
requests (the warm-up's are shown beside them). TTFT from each request's scheduled
arrival to its first content chunk.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from bench.host import git_state, machine_description
from epp_harness.procs import scratch_dir
from epp_harness.stack import LocalStack, StackOptions

RESULTS = Path(__file__).resolve().parent / "results"
MODEL = "base-model"


@dataclass(frozen=True)
class Settings:
    adapters: int = 8
    zipf: float = 1.1
    servers: int = 4
    max_loras: int = 2
    swap_ms: float = 100.0
    rate: float = 12.0
    duration_s: float = 20.0
    warmup_s: float = 4.0
    output_tokens: int = 16
    seed: int = 1

    def names(self) -> list[str]:
        return [f"adapter-{i}" for i in range(self.adapters)]

    def sim_args(self, registered: bool) -> list[str]:
        args = [
            "--enable-lora", "--max-loras", str(self.max_loras),
            "--lora-swap-ms", str(self.swap_ms), "--max-num-seqs", "8",
            "--decode-ms-per-token", "10", "--itl-ms-per-running-seq", "0.5",
            "--prefill-overhead-ms", "5", "--time-scale", "1",
        ]  # fmt: skip
        if registered:
            args += ["--lora-modules", *(f"{n}=/adapters/{n}" for n in self.names())]
        return args

    def epp_config(self, on_demand: bool) -> str:
        catalogue = ", ".join(f"{n}: /adapters/{n}" for n in self.names())
        text = f"models: {{adapters: {{{catalogue}}}}}\n"
        if on_demand:
            text += (
                "loraPlacement: {enabled: true, unloadLeastRecentlyUsed: true, "
                f"maxAdaptersPerServer: {self.max_loras}}}\n"
            )
        return text


@dataclass(slots=True)
class Record:
    due: float
    adapter: str
    measured: bool
    ttft_s: float | None = None
    error: str = ""


@dataclass
class Result:
    policy: str
    requests: int
    errors: int
    swaps: int
    runtime_loads: int
    loads_per_100: float
    # swaps and runtime loads since the simulators started, warm-up included
    all_swaps: int
    all_runtime_loads: int
    ttft_p50_ms: float
    ttft_p90_ms: float
    ttft_p99_ms: float
    served_by: dict[str, int] = field(default_factory=dict)


def schedule(s: Settings) -> list[tuple[float, str, bool]]:
    """(offset s, adapter, measured) of every request: Poisson arrivals, Zipf adapters."""
    rng = random.Random(s.seed)
    names = s.names()
    weights = [1 / (i + 1) ** s.zipf for i in range(len(names))]
    out: list[tuple[float, str, bool]] = []
    t = 0.0
    while True:
        t += rng.expovariate(s.rate)
        if t >= s.warmup_s + s.duration_s:
            return out
        out.append((t, rng.choices(names, weights)[0], t >= s.warmup_s))


async def one(session: aiohttp.ClientSession, url: str, rec: Record, s: Settings) -> None:
    loop = asyncio.get_running_loop()
    body = orjson.dumps({
        "model": rec.adapter, "prompt": f"Summarise this for {rec.adapter}. " * 8,
        "max_tokens": s.output_tokens, "stream": True,
    })  # fmt: skip
    try:
        async with session.post(url, data=body, headers={"content-type": "application/json"}) as r:
            if r.status != 200:
                rec.error = f"http-{r.status}"
                await r.read()
                return
            async for _ in r.content.iter_any():
                if rec.ttft_s is None:
                    rec.ttft_s = loop.time() - rec.due
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        rec.error = type(exc).__name__


async def drive(
    url: str, sims: list[str], s: Settings
) -> tuple[list[Record], list[dict[str, Any]]]:
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0),
        timeout=aiohttp.ClientTimeout(total=120),
    ) as session:
        loop = asyncio.get_running_loop()
        start = loop.time() + 0.5
        records, tasks = [], []
        stats_at_warmup: list[dict[str, Any]] = []
        warmup_done = False
        for offset, adapter, measured in schedule(s):
            if measured and not warmup_done:
                warmup_done = True
                await asyncio.sleep(max(0.0, start + offset - loop.time()))
                stats_at_warmup = await sim_stats(session, sims)
            rec = Record(start + offset, adapter, measured)
            await asyncio.sleep(max(0.0, rec.due - loop.time()))
            records.append(rec)
            tasks.append(asyncio.create_task(one(session, url, rec, s)))
        await asyncio.gather(*tasks)
        end = await sim_stats(session, sims)
    keys = ("lora_swaps", "lora_loads", "requests_total")
    totals = [
        {**{k: e[k] - b.get(k, 0) for k in keys}, **{f"all_{k}": e[k] for k in keys}}
        for b, e in zip(stats_at_warmup or [{} for _ in end], end, strict=True)
    ]
    return records, totals


async def sim_stats(session: aiohttp.ClientSession, urls: list[str]) -> list[dict[str, Any]]:
    out = []
    for u in urls:
        async with session.get(f"{u}/sim/stats") as r:
            out.append(await r.json())
    return out


def pct(values: Sequence[float], p: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))]


def run_policy(name: str, s: Settings, workdir: Path) -> Result:
    on_demand = name == "epp-on-demand"
    epp = name != "round-robin"
    config = workdir / f"{name}.yaml"
    config.write_text(s.epp_config(on_demand))
    opts = StackOptions(
        servers=s.servers, model=MODEL, envoy_port=0, envoy_admin_port=0, grpc_port=0,
        http_port=0, sim_args=s.sim_args(registered=not on_demand),
        epp_args=["--config", str(config)] if epp else [], log_level="warning",
        workdir=workdir / name, epp=epp, envoy_concurrency=1,
    )  # fmt: skip
    with LocalStack(opts) as stack:
        url = f"{stack.envoy_url}/v1/completions"
        records, totals = asyncio.run(drive(url, stack.sim_urls, s))
    measured = [r for r in records if r.measured]
    ok = [r.ttft_s for r in measured if not r.error and r.ttft_s is not None]
    swaps = sum(t["lora_swaps"] for t in totals)
    loads = sum(t["lora_loads"] for t in totals)
    return Result(
        policy=name,
        requests=len(measured),
        errors=sum(1 for r in measured if r.error),
        swaps=swaps,
        runtime_loads=loads,
        loads_per_100=100.0 * (swaps + loads) / max(len(measured), 1),
        all_swaps=sum(t["all_lora_swaps"] for t in totals),
        all_runtime_loads=sum(t["all_lora_loads"] for t in totals),
        ttft_p50_ms=1000 * pct(ok, 0.5),
        ttft_p90_ms=1000 * pct(ok, 0.9),
        ttft_p99_ms=1000 * pct(ok, 0.99),
        served_by={f"sim-{i}": t["requests_total"] for i, t in enumerate(totals)},
    )


def write(name: str, s: Settings, results: list[Result], label: str, note: str) -> None:
    meta = {
        "label": label,
        "note": note,
        "settings": asdict(s),
        "machine": machine_description(),
        "git": git_state(),
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    doc = {"meta": meta, "results": [asdict(r) for r in results]}
    (RESULTS / f"{name}.json").write_text(json.dumps(doc, indent=1) + "\n")
    rr = next((r for r in results if r.policy == "round-robin"), None)
    lines = [
        f"# LoRA adapter churn ({label})",
        "",
        f"{s.adapters} adapters, Zipf {s.zipf}, over {s.servers} simulated servers with "
        f"{s.max_loras} adapter slots each (swap {s.swap_ms:g} ms); Poisson "
        f"{s.rate:g} requests/s for {s.duration_s:g} s after {s.warmup_s:g} s of warm-up; "
        f"{s.output_tokens} output tokens. `python -m bench.lora` (bench/lora.py). "
        f"{meta['when']}, {meta['machine']}, {meta['git']}.",
        "",
        "| policy | requests | errors | slot swaps | runtime loads | loads / 100 req "
        "| loads with warm-up | TTFT p50 ms | TTFT p90 ms | TTFT p99 ms | p90 vs round robin |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        ratio = f"{r.ttft_p90_ms / rr.ttft_p90_ms:.2f}" if rr and rr.ttft_p90_ms else "\N{EN DASH}"
        lines.append(
            f"| {r.policy} | {r.requests} | {r.errors} | {r.swaps} | {r.runtime_loads} "
            f"| {r.loads_per_100:.1f} | {r.all_swaps + r.all_runtime_loads} "
            f"| {r.ttft_p50_ms:.0f} | {r.ttft_p90_ms:.0f} | {r.ttft_p99_ms:.0f} | {ratio} |"
        )
    if note:
        lines += ["", note]
    (RESULTS / f"{name}.md").write_text("\n".join(lines) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    d = Settings()
    parser = argparse.ArgumentParser(prog="python -m bench.lora", description=__doc__)
    parser.add_argument("--rate", type=float, default=d.rate, help="requests per second")
    parser.add_argument("--duration", type=float, default=d.duration_s, help="measured seconds")
    parser.add_argument("--warmup", type=float, default=d.warmup_s, help="unmeasured seconds")
    parser.add_argument("--adapters", type=int, default=d.adapters)
    parser.add_argument("--servers", type=int, default=d.servers)
    parser.add_argument("--max-loras", type=int, default=d.max_loras)
    parser.add_argument("--swap-ms", type=float, default=d.swap_ms)
    parser.add_argument("--name", default="lora", help="result file name under bench/results")
    parser.add_argument(
        "--label", default="full run", help="what kind of run this is, shown in the result"
    )
    parser.add_argument("--note", default="", help="a paragraph added under the table")
    args = parser.parse_args(argv)
    s = Settings(
        adapters=args.adapters, servers=args.servers, max_loras=args.max_loras,
        swap_ms=args.swap_ms, rate=args.rate, duration_s=args.duration, warmup_s=args.warmup,
    )  # fmt: skip
    workdir = scratch_dir("epp-bench-lora-")
    results = []
    for policy in ("round-robin", "epp", "epp-on-demand"):
        result = run_policy(policy, s, workdir)
        print(json.dumps(asdict(result)), flush=True)
        results.append(result)
    write(args.name, s, results, args.label, args.note)
    print(f"wrote {RESULTS / args.name}.{{json,md}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
