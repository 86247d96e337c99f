"""Decision cost: how long one scheduling cycle takes (in process, no I/O), by pool size
and prompt size, with the default config; and the EPP's added latency through Envoy for
a 220 KB prompt at concurrency 20. Writes bench/results/decision.{md,json}.
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path
from typing import Any

import orjson

from bench.host import machine_description
from epp.config import DEFAULT_CONFIG, build_scheduler
from epp.types import Endpoint, EndpointMetrics, EndpointState, InferenceRequest, Snapshot

RESULTS = Path(__file__).resolve().parent / "results"


def pool(n: int, rng: random.Random) -> Snapshot:
    now = time.monotonic()
    states = tuple(
        EndpointState(
            Endpoint(f"10.{i // 65536}.{i // 256 % 256}.{i % 256}", 8000),
            EndpointMetrics(
                updated_at=now,
                waiting=rng.randint(0, 8),
                running=rng.randint(0, 16),
                kv_usage=rng.random(),
            ),
        )
        for i in range(n)
    )
    return Snapshot(states, {s.address: rng.randint(0, 4) for s in states})


def cycle_cost(endpoints: int, prompt_chars: int, cycles: int, seed: int = 0) -> dict[str, Any]:
    """Schedule ``cycles`` requests (10 shared system prompts + a unique tail, so the
    prefix index is populated and matched) and time each cycle, routing included."""
    rng = random.Random(seed)
    sched = build_scheduler(DEFAULT_CONFIG)
    snap = pool(endpoints, rng)
    prefixes = ["".join(rng.choice("abcdefgh ") for _ in range(prompt_chars)) for _ in range(10)]
    times = []
    for i in range(cycles):
        prompt = prefixes[i % 10][: prompt_chars - 12] + f"{i:012d}"
        req = InferenceRequest(str(i), "model", "/v1/chat/completions", prompt=prompt)
        t0 = time.perf_counter()
        result = sched.schedule(req, snap, rng)
        sched.on_routed(req, result, snap)
        times.append(time.perf_counter() - t0)
    times.sort()
    return {
        "endpoints": endpoints,
        "prompt_bytes": prompt_chars,
        "cycles": cycles,
        "p50_us": times[len(times) // 2] * 1e6,
        "p99_us": times[int(len(times) * 0.99)] * 1e6,
        "max_us": times[-1] * 1e6,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cycles", type=int, default=2000)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    rows = []
    for endpoints in (10, 100, 1000):
        for prompt in (1024, 220 * 1024):
            row = cycle_cost(endpoints, prompt, args.cycles)
            print(f"  {endpoints:5} endpoints, {prompt // 1024:4} KB: p50 {row['p50_us']:.0f} µs, "
                  f"p99 {row['p99_us']:.0f} µs", flush=True)  # fmt: skip
            rows.append(row)
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": machine_description(),
    }
    (args.out / "decision.json").write_bytes(
        orjson.dumps({"meta": meta, "rows": rows}, option=orjson.OPT_INDENT_2)
    )
    lines = [
        "# Decision cost: one scheduling cycle with the default config",
        "",
        f"Measured {meta['date']} on {meta['machine']} with `python -m bench.decision` "
        f"({args.cycles} cycles per cell, in process: snapshot -> filters -> queue, KV, "
        "in-flight and prefix-cache scorers -> picker -> prefix-index update; prompts share "
        "one of 10 system prompts so the index is populated and matched).",
        "",
        "| endpoints | prompt | p50 µs | p99 µs | max µs |",
        "|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['endpoints']} | {r['prompt_bytes'] // 1024} KB | {r['p50_us']:.0f} "
            f"| {r['p99_us']:.0f} | {r['max_us']:.0f} |"
        )
    (args.out / "decision.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out / 'decision.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
