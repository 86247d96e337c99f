"""Fairness under a flood: two tenants against a small simulated pool, with and without
flow control, side by side in one run.

Tenant A floods: ``--flood`` closed-loop streams (default 3 x the pool's slots), each
sending its next request as soon as the last one ends. Tenant B sends at
``--b-share`` (default 20 %) of the pool's capacity, open loop (Poisson arrivals), so
its requests arrive whatever the pool does. Every request streams, and its TTFT is the
time to the first body chunk (the first token). Three scenarios, each on a fresh stack
(``epp stack``: Envoy, the EPP, ``--servers`` simulators of ``--slots`` sequences):

* ``B alone``: B's requests with nothing else (flow control on);
* ``flood, flow control``: A + B, ``flowControl.enabled: true`` (the default);
* ``flood, no flow control``: A + B, ``flowControl.enabled: false`` (requests go to the
  servers at once and wait in their queues).

The pool's capacity is its slots over one request's service time on the simulator
(prefill + output tokens x per-token time at a full batch). The target: B's TTFT p90
under the flood within 2 x (B's p90 alone + the pool's mean time between two
completions), i.e. a light tenant waits for about one freed slot however hard another
floods, A getting the remaining throughput, and the total throughput no lower than
without flow control (fairness must not cost capacity).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from prometheus_client.parser import text_string_to_metric_families

from bench.host import git_state, machine_description
from epp_harness.sim.config import SimConfig
from epp_harness.stack import LocalStack, StackOptions

RESULTS = Path(__file__).resolve().parent / "results"
FAIRNESS_HEADER = "x-llm-d-inference-fairness-id"


@dataclass
class Tenant:
    ttft_s: list[float] = field(default_factory=list)
    done: int = 0
    errors: dict[int, int] = field(default_factory=dict)


async def one_request(host: str, port: int, raw: bytes, tenant: Tenant, count: bool) -> None:
    """Send one streamed request on a new connection; note its TTFT and outcome."""
    t0 = time.perf_counter()
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(raw)
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        first: float | None = None
        if b"transfer-encoding: chunked" in head.lower():
            while True:
                size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                await reader.readexactly(size + 2)
                if first is None and size:
                    first = time.perf_counter() - t0
                if size == 0:
                    break
        else:
            await reader.read()
    finally:
        writer.close()
    if not count:
        return
    if status == 200 and first is not None:
        tenant.ttft_s.append(first)
        tenant.done += 1
    else:
        tenant.errors[status] = tenant.errors.get(status, 0) + 1


def request_bytes(host: str, port: int, tokens: int, fairness_id: str, i: int) -> bytes:
    body = orjson.dumps(
        {
            "model": "sim-model",
            "prompt": f"{fairness_id} {i} hello",
            "max_tokens": tokens,
            "stream": True,
        }
    )
    return (
        f"POST /v1/completions HTTP/1.1\r\nhost: {host}:{port}\r\n"
        f"content-type: application/json\r\n{FAIRNESS_HEADER}: {fairness_id}\r\n"
        f"connection: close\r\ncontent-length: {len(body)}\r\n\r\n"
    ).encode() + body


async def flood(host: str, port: int, streams: int, tokens: int, start: float, stop: float,
                tenant: Tenant) -> None:  # fmt: skip
    async def stream(n: int) -> None:
        i = 0
        while (now := time.perf_counter()) < stop:
            i += 1
            raw = request_bytes(host, port, tokens, "tenant-a", n * 100_000 + i)
            await one_request(host, port, raw, tenant, now >= start)

    await asyncio.gather(*(stream(n) for n in range(streams)))


async def poisson(host: str, port: int, rate: float, tokens: int, start: float, stop: float,
                  tenant: Tenant, rng: random.Random) -> None:  # fmt: skip
    tasks = []
    i = 0
    while (now := time.perf_counter()) < stop:
        i += 1
        raw = request_bytes(host, port, tokens, "tenant-b", i)
        tasks.append(asyncio.ensure_future(one_request(host, port, raw, tenant, now >= start)))
        await asyncio.sleep(rng.expovariate(rate))
    await asyncio.gather(*tasks)


def capacity_of(servers: int, slots: int, tokens: int) -> tuple[float, float]:
    """(one request's service time in s, the pool's capacity in requests/s): its slots
    over a request's prefill + ``tokens`` x the per-token time at a full batch, on the
    simulator's default timings."""
    sim = SimConfig()
    service_s = (
        sim.prefill_overhead_ms
        + tokens * (sim.decode_ms_per_token + sim.itl_ms_per_running_seq * slots)
    ) / 1000 * sim.time_scale  # fmt: skip
    return service_s, servers * slots / service_s


def p(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def drive(stack: LocalStack, args: argparse.Namespace, with_a: bool,
                rate_b: float) -> dict[str, Any]:  # fmt: skip
    host, port = "127.0.0.1", int(stack.envoy_url.rsplit(":", 1)[1])
    now = time.perf_counter()
    start, stop = now + args.warmup, now + args.warmup + args.duration
    a, b = Tenant(), Tenant()
    jobs = [poisson(host, port, rate_b, args.tokens, start, stop, b, random.Random(7))]
    if with_a:
        jobs.append(flood(host, port, args.flood, args.tokens, start, stop, a))
    await asyncio.gather(*jobs)
    return {
        "b_ttft_p50_ms": p(b.ttft_s, 0.5) * 1000,
        "b_ttft_p90_ms": p(b.ttft_s, 0.9) * 1000,
        "b_done": b.done,
        "b_errors": b.errors,
        "a_rps": a.done / args.duration,
        "a_errors": a.errors,
        "total_rps": (a.done + b.done) / args.duration,
    }


def scenario(args: argparse.Namespace, name: str, config: str, with_a: bool,
             rate_b: float) -> dict[str, Any]:  # fmt: skip
    workdir = args.workdir / name.replace(" ", "-").replace(",", "")
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "epp.yaml"
    path.write_text(config)
    opts = StackOptions(
        servers=args.servers,
        envoy_port=0, envoy_admin_port=0, grpc_port=0, http_port=0,
        sim_args=["--max-num-seqs", str(args.slots)],
        epp_args=["--config", str(path)],
        log_level="warning",
        workdir=workdir,
    )  # fmt: skip
    with LocalStack(opts) as stack:
        row = asyncio.run(drive(stack, args, with_a, rate_b))
        row.update(held_ms(stack.epp_http_url))
    row["scenario"] = name
    print(f"  {name}: B p90 {row['b_ttft_p90_ms']:.0f} ms (p50 {row['b_ttft_p50_ms']:.0f}, "
          f"{row['b_done']} done, errors {row['b_errors']}), A {row['a_rps']:.1f} rps "
          f"(errors {row['a_errors']}), total {row['total_rps']:.1f} rps; held in the EPP "
          f"on average: B {row['b_held_ms']:.0f} ms, A {row['a_held_ms']:.0f} ms",
          flush=True)  # fmt: skip
    return row


def held_ms(epp_http_url: str) -> dict[str, float]:
    """Each tenant's mean time held in the EPP's flow control (ms; warm-up included),
    from its queue-duration histogram: what of B's TTFT is spent waiting for room."""
    with urllib.request.urlopen(f"{epp_http_url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    sums: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        if family.name != "llm_d_epp_flow_control_request_queue_duration_seconds":
            continue
        for sample in family.samples:
            if sample.labels.get("outcome") != "Dispatched":
                continue
            kind = sample.name.rsplit("_", 1)[-1]  # sum | count
            key = (sample.labels.get("fairness_id", ""), kind)
            sums[key] = sums.get(key, 0.0) + sample.value
    out = {}
    for tenant, short in (("tenant-a", "a"), ("tenant-b", "b")):
        count = sums.get((tenant, "count"), 0.0)
        out[f"{short}_held_ms"] = 1000 * sums.get((tenant, "sum"), 0.0) / count if count else 0.0
    return out


def _command_line(argv: list[str]) -> str:
    """The arguments as typed, but the label (printed on its own)."""
    out, skip = [], False
    for a in argv:
        if skip or a == "--label" or a.startswith("--label="):
            skip = a == "--label"
            continue
        out.append(f" {a}")
    return "".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--servers", type=int, default=4)
    parser.add_argument("--slots", type=int, default=2, help="sequences per server")
    parser.add_argument("--tokens", type=int, default=20, help="output tokens per request")
    parser.add_argument("--flood", type=int, default=0, help="A's streams (0: 3 x slots)")
    parser.add_argument("--b-share", type=float, default=0.2, help="B's rate / capacity")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds measured")
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument(
        "--max-concurrency",
        type=int,
        default=0,
        help="set saturationDetector.maxConcurrency (0: the default, slots learned)",
    )
    parser.add_argument("--label", default="", help="a note printed with the results")
    parser.add_argument("--name", default="fairness")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/epp-bench-fairness"))
    args = parser.parse_args()
    slots = args.servers * args.slots
    args.flood = args.flood or 3 * slots
    service_s, capacity = capacity_of(args.servers, args.slots, args.tokens)
    rate_b = args.b_share * capacity
    print(f"pool: {slots} slots, ~{service_s * 1000:.0f} ms per request, capacity "
          f"~{capacity:.0f} rps; A: {args.flood} streams; B: {rate_b:.1f} rps")  # fmt: skip
    base = (
        f"saturationDetector: {{maxConcurrency: {args.max_concurrency}}}\n"
        if args.max_concurrency
        else ""
    )
    on = base + "flowControl: {enabled: true}\n"
    off = base + "flowControl: {enabled: false}\n"
    rows = [
        scenario(args, "B alone", on, False, rate_b),
        scenario(args, "flood, flow control", on, True, rate_b),
        scenario(args, "flood, no flow control", off, True, rate_b),
    ]
    alone, fc, nofc = rows
    gap_ms = 1000 / fc["total_rps"] if fc["total_rps"] else float("nan")
    bound_ms = 2 * (alone["b_ttft_p90_ms"] + gap_ms)
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": machine_description(),
        "git": git_state(),
        "label": args.label,
        "servers": args.servers,
        "slots": args.slots,
        "tokens": args.tokens,
        "flood_streams": args.flood,
        "b_rate": rate_b,
        "capacity_rps": capacity,
        "duration_s": args.duration,
        "b_p90_bound_ms": bound_ms,
        "b_p90_within_bound": fc["b_ttft_p90_ms"] <= bound_ms,
        "total_not_lower": fc["total_rps"] >= nofc["total_rps"],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_bytes(
        orjson.dumps({"meta": meta, "rows": rows}, option=orjson.OPT_INDENT_2)
    )
    ok = "met" if meta["b_p90_within_bound"] else "missed"
    lines = [
        "# Fairness under a flood",
        "",
        (f"**{args.label}.** " if args.label else "")
        + f"Measured {meta['date']} on {meta['machine']} (code at {meta['git']}) with "
        f"`python -m bench.fairness{_command_line(sys.argv[1:])}`: "
        f"{args.servers} simulated servers of {args.slots} slots (~{service_s * 1000:.0f} ms "
        f"per request of {args.tokens} streamed tokens, capacity ~{capacity:.0f} rps); "
        f"tenant A floods with {args.flood} closed-loop streams, tenant B sends "
        f"{rate_b:.1f} rps (Poisson, {args.b_share:.0%} of capacity); {args.duration:g} s "
        "measured per scenario. TTFT: time to the first streamed chunk. *Held*: the mean "
        "time a tenant's requests waited in the EPP's flow control (its queue-duration "
        "histogram, warm-up included).",
        "",
        "| scenario | B TTFT p50 ms | B TTFT p90 ms | B held ms | B done | B errors | A rps "
        "| A held ms | A errors | total rps |",
        "|---|---:|---:|---:|---:|---|---:|---:|---|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['scenario']} | {r['b_ttft_p50_ms']:.0f} | {r['b_ttft_p90_ms']:.0f} "
            f"| {r['b_held_ms']:.0f} | {r['b_done']} | {r['b_errors'] or '-'} "
            f"| {r['a_rps']:.1f} | {r['a_held_ms']:.0f} | {r['a_errors'] or '-'} "
            f"| {r['total_rps']:.1f} |"
        )
    lines += [
        "",
        f"Target: B's p90 under the flood ≤ 2 x (B's p90 alone + the mean time between two "
        f"completions) = 2 x ({alone['b_ttft_p90_ms']:.0f} + {gap_ms:.0f}) = "
        f"{bound_ms:.0f} ms: **{ok}** ({fc['b_ttft_p90_ms']:.0f} ms; without flow control "
        f"{nofc['b_ttft_p90_ms']:.0f} ms). Total throughput with flow control "
        f"{fc['total_rps']:.1f} rps vs {nofc['total_rps']:.1f} without: "
        f"**{'not lower' if meta['total_not_lower'] else 'lower'}**.",
    ]
    (args.out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out / (args.name + '.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
