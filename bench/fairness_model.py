"""bench.fairness on the routing model's virtual clock: the same two tenants, pool and
target, with the real router, flow control and scheduler and the real simulator
engine, but no Envoy, HTTP or CPU contention (bench.routing_model, docs/routing-model.md).

Run: ``.venv/bin/python -m bench.fairness_model`` (seconds). Writes
bench/results/NAME.{md,json} (``--name``, default routing-model-fairness: listed with
the routing model's files in the results index).

It separates what the EPP's design gives from what a busy machine adds: the real
benchmark (`make bench-fairness`) runs its load generator, Envoy, the EPP and four
simulators on the same two cores. It also gives the floor under each flood (:func:`floor`:
the first slot freed after each of B's arrivals), and the same floods with A's streams
started spread over one service time (bench.fairness starts them together, so with
alike requests the pool's slots free in bursts).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import random
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from bench.fairness import FAIRNESS_HEADER, capacity_of
from bench.routing import Planned, Record, SimSettings, Workload, pct
from bench.routing_model import (
    RESULTS,
    ModelPolicy,
    Setting,
    build_pool,
    one_request,
    parse_model_policy,
    stop_pool,
)
from bench.virtualtime import run_virtual
from bench.workload import WorkloadSpec
from epp_harness.sim.config import SimConfig

FAIR_SHARE = "fair-share=configs/flow-control-fair-share.yaml"
# (scenario, policy spec, with tenant A, A's streams staggered)
SCENARIOS = (
    ("B alone", "on=configs/flow-control.yaml", False, False),
    ("flood, flow control", "on=configs/flow-control.yaml", True, False),
    ("flood, flow control, room dispatch", "room=configs/flow-control-room.yaml", True, False),
    ("flood, flow control, fair-share", FAIR_SHARE, True, False),
    ("flood, no flow control", "off=configs/flow-control-off.yaml", True, False),
    ("flood staggered, flow control", "on=configs/flow-control.yaml", True, True),
    ("flood staggered, flow control, fair-share", FAIR_SHARE, True, True),
    ("flood staggered, no flow control", "off=configs/flow-control-off.yaml", True, True),
)


def make_setting(servers: int, slots: int) -> Setting:
    """bench.fairness's pool: ``epp sim``'s default timings, ``slots`` sequences each."""
    sim = SimConfig()
    settings = SimSettings(
        max_num_seqs=slots,
        kv_blocks=sim.kv_blocks,
        block_size=sim.block_size,
        prefill_overhead_ms=sim.prefill_overhead_ms,
        prefill_ms_per_token=sim.prefill_ms_per_token,
        decode_ms_per_token=sim.decode_ms_per_token,
        itl_ms_per_running_seq=sim.itl_ms_per_running_seq,
    )
    spec = WorkloadSpec()
    workload = Workload("control", spec, [], {}, servers)  # unused: requests are built here
    return Setting(settings, servers, workload)


def planned(tenant: str, i: int, tokens: int) -> Planned:
    body = {
        "model": "sim-model",
        "messages": [{"role": "user", "content": f"{tenant} {i} hello"}],
        "max_tokens": tokens,
        "stream": True,
    }
    return Planned(0.0, orjson.dumps(body), 0, tokens, {FAIRNESS_HEADER: tenant}, (), (), {})


async def scenario(
    setting: Setting,
    policy: ModelPolicy,
    args: argparse.Namespace,
    with_a: bool,
    rate_b: float,
    stagger: bool = False,
) -> dict[str, Any]:
    """One scenario's run; ``stagger``: A's first stream per slot starts at each
    1/slots of a service time and the others a service time later, so the pool's slots
    free one at a time instead of together (bench.fairness starts them together)."""
    pool = build_pool(setting, policy)
    loop = asyncio.get_running_loop()
    start = loop.time() + args.warmup
    stop = start + args.duration
    counter = itertools.count()
    measured: dict[str, list[Record]] = {"tenant-a": [], "tenant-b": []}
    everything: list[Record] = []

    async def send(tenant: str) -> None:
        index = next(counter)
        rec = Record(0, args.tokens, loop.time())
        everything.append(rec)
        await one_request(pool, setting, policy, planned(tenant, index, args.tokens), rec, index)
        if start <= rec.due < stop:
            measured[tenant].append(rec)
        if rec.error is not None:
            await asyncio.sleep(0.01)  # a closed loop must not spin on errors

    async def stream(n: int) -> None:
        if stagger:
            slots = args.servers * args.slots
            service_s, _ = capacity_of(args.servers, args.slots, args.tokens)
            await asyncio.sleep((n % slots / slots + n // slots) * service_s)
        while loop.time() < stop:
            await send("tenant-a")

    async def poisson(rng: random.Random) -> None:
        tasks = []
        while loop.time() < stop:
            tasks.append(loop.create_task(send("tenant-b")))
            await asyncio.sleep(rng.expovariate(rate_b))
        await asyncio.gather(*tasks)

    jobs = [poisson(random.Random(args.seed))]
    if with_a:
        jobs += [stream(n) for n in range(args.flood)]
    try:
        await asyncio.gather(*jobs)
    finally:
        await stop_pool(pool)
    a, b = measured["tenant-a"], measured["tenant-b"]
    b_ttft = sorted(r.ttft_s * 1000 for r in b if r.error is None and r.ttft_s is not None)
    a_done = sum(1 for r in a if r.error is None and r.e2e_s is not None)
    b_done = len(b_ttft)
    return {
        "b_ttft_p50_ms": pct(b_ttft, 0.5),
        "b_ttft_p90_ms": pct(b_ttft, 0.9),
        "b_done": b_done,
        "errors": sum(1 for r in a + b if r.error is not None),
        "a_rps": a_done / args.duration,
        "total_rps": (a_done + b_done) / args.duration,
        **floor(b, everything, start, stop),
    }


def oracle_waits(arrivals: Sequence[float], frees: Sequence[float]) -> list[float]:
    """The least each of ``arrivals`` (sorted) could wait for a slot when every slot is
    busy, with no preemption and no slot kept idle: the first slot freed at or after it
    that no earlier arrival took. ``frees``: each instant a slot freed (sorted, one entry
    per slot). NaN for an arrival after the last one."""
    out = []
    j = 0
    for arrival in arrivals:
        while j < len(frees) and frees[j] < arrival:
            j += 1
        if j < len(frees):
            out.append(frees[j] - arrival)
            j += 1
        else:
            out.append(math.nan)
    return out


def floor(b: list[Record], everything: list[Record], start: float, stop: float) -> dict[str, float]:
    """The oracle floor of a flood run: from the instants its slots actually freed
    (every request's end), the first one after each of B's arrivals (:func:`oracle_waits`)
    and B's TTFT had it taken it (that wait + what B spent after leaving the EPP: hop,
    the engine's step, prefill). With A's requests all alike, which tenant took a freed
    slot does not change when the next one frees, so these instants hold for any
    dispatcher that refills a freed slot at once. Also how the instants are spread: the
    gaps between distinct instants and the slots freed per instant."""
    ends = sorted(r.due + r.e2e_s for r in everything if r.error is None and r.e2e_s is not None)
    done = [r for r in sorted(b, key=lambda r: r.due) if r.ttft_s is not None]
    if not done or not ends:
        return {}
    waits = oracle_waits([r.due for r in done], ends)
    sent = [r.sent_s or 0.0 for r in done]
    ttft = [w + (r.ttft_s or 0.0) - s for w, r, s in zip(waits, done, sent, strict=True)]
    instants = sorted({round(t, 6) for t in ends if start <= t < stop})
    gaps = sorted(y - x for x, y in itertools.pairwise(instants))
    in_window = sum(1 for t in ends if start <= t < stop)
    ms = [1000 * x for x in sorted(sent)]
    return {
        "b_wait_p50_ms": pct(ms, 0.5),
        "b_wait_p90_ms": pct(ms, 0.9),
        "floor_wait_p50_ms": pct(sorted(1000 * w for w in waits), 0.5),
        "floor_wait_p90_ms": pct(sorted(1000 * w for w in waits), 0.9),
        "floor_ttft_p50_ms": pct(sorted(1000 * t for t in ttft), 0.5),
        "floor_ttft_p90_ms": pct(sorted(1000 * t for t in ttft), 0.9),
        "gap_mean_ms": 1000 * statistics.fmean(gaps) if gaps else math.nan,
        "gap_p90_ms": 1000 * pct(gaps, 0.9) if gaps else math.nan,
        "gap_max_ms": 1000 * gaps[-1] if gaps else math.nan,
        "freed_per_instant": in_window / len(instants) if instants else math.nan,
    }


def floor_table(rows: list[dict[str, Any]]) -> list[str]:
    """The oracle floor beside what each flood run gave (:func:`floor`)."""
    lines = [
        "",
        "## The floor: the first slot freed after B's arrival",
        "",
        "From each run's own slot-free instants (every request's end), the first one after "
        "each of B's arrivals that no earlier B request took: the least any dispatcher that "
        "refills a freed slot at once (no preemption, no slot kept idle) could make B wait. "
        "Floor TTFT: that wait + what B spent after leaving the EPP (none without flow "
        "control: B waited in the servers' queues). Gaps: between the distinct instants at "
        "which slots freed, in the measured window.",
        "",
        "| scenario | B wait in the EPP p50 / p90 ms | floor wait p50 / p90 ms "
        "| floor TTFT p50 / p90 ms | gap mean / p90 / max ms | slots freed per instant |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        ttft = f"{r['floor_ttft_p50_ms']:.0f} / {r['floor_ttft_p90_ms']:.0f}"
        if not r["b_wait_p90_ms"]:  # B waited in the servers' queues: its TTFT has them
            ttft = "-"
        lines.append(
            f"| {r['scenario']} | {r['b_wait_p50_ms']:.0f} / {r['b_wait_p90_ms']:.0f} "
            f"| {r['floor_wait_p50_ms']:.0f} / {r['floor_wait_p90_ms']:.0f} "
            f"| {ttft} "
            f"| {r['gap_mean_ms']:.0f} / {r['gap_p90_ms']:.0f} / {r['gap_max_ms']:.0f} "
            f"| {r['freed_per_instant']:.1f} |"
        )
    return lines


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.fairness_model", description=__doc__)
    add = p.add_argument
    add("--servers", type=int, default=4)
    add("--slots", type=int, default=2, help="sequences per server")
    add("--tokens", type=int, default=20, help="output tokens per request")
    add("--flood", type=int, default=0, help="A's streams (0: 3 x slots)")
    add("--b-share", type=float, default=0.2, help="B's rate / capacity")
    add("--duration", type=float, default=20.0, help="virtual seconds measured")
    add("--warmup", type=float, default=3.0)
    add("--seed", type=int, default=7, help="B's arrivals")
    add("--name", default="routing-model-fairness")
    add("--out", type=Path, default=RESULTS)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    slots = args.servers * args.slots
    args.flood = args.flood or 3 * slots
    service_s, capacity = capacity_of(args.servers, args.slots, args.tokens)
    rate_b = args.b_share * capacity
    setting = make_setting(args.servers, args.slots)
    rows = []
    for name, spec, with_a, stagger in SCENARIOS:
        policy = parse_model_policy(spec)
        row = run_virtual(scenario(setting, policy, args, with_a, rate_b, stagger))
        row["scenario"] = name
        rows.append(row)
        print(
            f"  {name}: B p90 {row['b_ttft_p90_ms']:.0f} ms (p50 {row['b_ttft_p50_ms']:.0f}),"
            f" A {row['a_rps']:.1f} rps, total {row['total_rps']:.1f} rps",
            flush=True,
        )
    alone, fc = rows[0], rows[1]
    gap_ms = 1000 / fc["total_rps"] if fc["total_rps"] else float("nan")
    bound_ms = 2 * (alone["b_ttft_p90_ms"] + gap_ms)
    command = "".join(f" {a}" for a in (sys.argv[1:] if argv is None else argv))
    lines = [
        "# Fairness under a flood: the virtual-time model",
        "",
        "bench.fairness's two tenants on the routing model's virtual clock (real router, "
        "flow control, scheduler and simulator engine; no Envoy, HTTP or CPU contention): "
        f"`python -m bench.fairness_model{command}`. {args.servers} servers of "
        f"{args.slots} slots (~{service_s * 1000:.0f} ms per request of {args.tokens} "
        f"tokens, capacity ~{capacity:.0f} rps); A: {args.flood} closed-loop streams; B: "
        f"{rate_b:.1f} rps (Poisson); {args.duration:g} virtual s measured.",
        "",
        "| scenario | B TTFT p50 ms | B TTFT p90 ms | B done | A rps | total rps | errors |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['scenario']} | {r['b_ttft_p50_ms']:.0f} | {r['b_ttft_p90_ms']:.0f} "
            f"| {r['b_done']} | {r['a_rps']:.1f} | {r['total_rps']:.1f} | {r['errors']} |"
        )
    ok = "met" if fc["b_ttft_p90_ms"] <= bound_ms else "missed"
    others = ", ".join(
        f"{r['scenario']} {r['b_ttft_p90_ms']:.0f} ms"
        for r in rows[2:]
        if "no flow control" not in r["scenario"]
    )
    lines += [
        "",
        f"Target: B's p90 under the flood ≤ 2 x ({alone['b_ttft_p90_ms']:.0f} + {gap_ms:.0f})"
        f" = {bound_ms:.0f} ms: **{ok}** ({fc['b_ttft_p90_ms']:.0f} ms; {others}).",
    ]
    lines += floor_table([r for r in rows if "floor_wait_p90_ms" in r and r is not alone])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    meta = {"command": command, "bound_ms": bound_ms, "b_rate": rate_b, "capacity": capacity}
    (args.out / f"{args.name}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print(f"wrote {args.out / (args.name + '.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
