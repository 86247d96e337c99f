"""Decision cost: how long one scheduling cycle takes (in process, no I/O), by pool size
and prompt size, with the default config; and the EPP's added latency through Envoy for
a 220 KB prompt at concurrency 20. Writes bench/results/decision.{md,json}.

Each cycle also times admission as flow control does it when nothing is queued (the
request's priority and fairness id, which endpoints have room, the queue-time count):
the dispatch overhead a request pays before scheduling.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson

from bench.host import machine_description
from epp.config import build_scheduler
from epp.datastore import Datastore
from epp.flowcontrol.queues import fairness_id
from epp.observability.metrics import EppMetrics
from epp.scheduling.base import VECTORIZE_FROM
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


class Cell:
    """One table cell: a scheduler, a pool and its prefix index, timed cycle by cycle.
    Prompts share one of 10 system prompts plus a unique tail, so the prefix index is
    populated and matched; routing (the index update) is part of each cycle.
    ``vectorize_from``: candidates from which numpy scores (huge = the list path only).
    ``churn``: before each cycle one endpoint reports new metrics, so every cycle sees
    a new snapshot (as the datastore builds one per metrics update)."""

    def __init__(
        self,
        endpoints: int,
        prompt_chars: int,
        seed: int = 0,
        *,
        vectorize_from: int = VECTORIZE_FROM,
        churn: bool = False,
        config: str = "",  # empty: the built-in default
    ) -> None:
        self.endpoints, self.prompt_chars = endpoints, prompt_chars
        self.vectorize_from, self.churn = vectorize_from, churn
        self.rng = random.Random(seed)
        self.sched = build_scheduler(config)
        self.sched.vectorize_from = vectorize_from
        self.snap = pool(endpoints, self.rng)
        self.prefixes = [
            "".join(self.rng.choice("abcdefgh ") for _ in range(prompt_chars)) for _ in range(10)
        ]
        self.by_address = {s.address: s for s in self.snap.endpoints}
        self.times: list[float] = []
        self.admission: list[float] = []
        self.queue_seconds = EppMetrics(Datastore()).flow_queue_seconds

    def run(self, cycles: int) -> None:
        rng, snap = self.rng, self.snap
        for _ in range(cycles):
            i = len(self.times)
            if self.churn:
                states = list(snap.endpoints)
                j = i % self.endpoints
                m = states[j].metrics
                assert m is not None
                metrics = replace(m, updated_at=time.monotonic(), waiting=rng.randint(0, 8))
                states[j] = replace(states[j], metrics=metrics)
                self.by_address[states[j].address] = states[j]  # the datastore's live index
                snap = Snapshot(tuple(states), snap.in_flight, by_address=self.by_address)
            prompt = self.prefixes[i % 10][: self.prompt_chars - 12] + f"{i:012d}"
            req = InferenceRequest(str(i), "model", "/v1/chat/completions", prompt=prompt)
            t0 = time.perf_counter()
            band = self.sched.priority(req)
            flow = fairness_id(req.headers)
            self.sched.room(req, snap)
            self.queue_seconds.labels(flow, str(band), "Dispatched").observe(0.0)
            self.admission.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            result = self.sched.schedule(req, snap, rng)
            self.sched.on_routed(req, result, snap)
            self.times.append(time.perf_counter() - t0)
        self.snap = snap

    def summary(self) -> dict[str, Any]:
        times = sorted(self.times)
        admission = sorted(self.admission)
        return {
            "admission_p50_us": admission[len(admission) // 2] * 1e6,
            "admission_p99_us": admission[int(len(admission) * 0.99)] * 1e6,
            "endpoints": self.endpoints,
            "prompt_bytes": self.prompt_chars,
            "cycles": len(times),
            "churn": self.churn,
            "vectorize_from": self.vectorize_from,
            "p50_us": times[len(times) // 2] * 1e6,
            "p99_us": times[int(len(times) * 0.99)] * 1e6,
            "max_us": times[-1] * 1e6,
        }


LIST_PATH = 10**9  # vectorize_from that never uses numpy
ROUND = 500  # cycles a run takes before the other path's turn (few cold switches)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cycles", type=int, default=2000)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--config", type=Path, default=None, help="scheduling config (default: the built-in)"
    )
    parser.add_argument("--name", default="decision", help="file name stem of the outputs")
    parser.add_argument(
        "--endpoints", type=int, nargs="+", default=[10, 100, 1000], help="pool sizes"
    )
    args = parser.parse_args()
    config = "" if args.config is None else args.config.read_text()
    source = "the default config" if args.config is None else f"`{args.config}`"
    big = max(args.endpoints)
    specs = [(n, p, False) for n in args.endpoints for p in (1024, 220 * 1024)]
    specs += [(big, 1024, True), (big, 220 * 1024, True)]
    rows = []
    for n, prompt, churn in specs:
        # the cell with numpy and with the list path, advancing in turns of ROUND
        # cycles, so a slow spell of the machine hits both alike
        pair = (
            Cell(n, prompt, churn=churn, config=config),
            Cell(n, prompt, churn=churn, vectorize_from=LIST_PATH, config=config),
        )
        for done in range(0, args.cycles, ROUND):
            for cell in pair:
                cell.run(min(ROUND, args.cycles - done))
        row, lists = pair[0].summary(), pair[1].summary()
        row["list_path"] = lists
        note = ", new snapshot every cycle" if row["churn"] else ""
        print(f"  {row['endpoints']:5} endpoints, {row['prompt_bytes'] // 1024:4} KB{note}: "
              f"p50 {row['p50_us']:.0f} µs, p99 {row['p99_us']:.0f} µs (list path: "
              f"p50 {lists['p50_us']:.0f}, p99 {lists['p99_us']:.0f})", flush=True)  # fmt: skip
        rows.append(row)
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": machine_description(),
        "config": source,
    }
    (args.out / f"{args.name}.json").write_bytes(
        orjson.dumps({"meta": meta, "rows": rows}, option=orjson.OPT_INDENT_2)
    )
    lines = [
        f"# Decision cost: one scheduling cycle with {source}",
        "",
        f"Measured {meta['date']} on {meta['machine']} with `python -m bench.decision"
        + "".join(f" {a}" for a in sys.argv[1:])
        + f"` ({args.cycles} cycles per cell, in process: snapshot -> filters -> scorers -> "
        "picker -> the latency model's prediction for the pick -> prefix-index update; "
        "prompts share one of 10 system prompts so the index is populated and matched). "
        "A cell's numpy and "
        f"list-path runs take turns every {ROUND} cycles, so a slow spell of the machine "
        "hits both alike.",
        "",
        f"From {VECTORIZE_FROM} candidates on, the built-in plugins score with numpy over "
        "metric columns built once per snapshot; below that, with Python lists. The "
        "*list path* columns run the same cells with numpy off (the scheduler before "
        "vectorization), in the same run. *New snapshot every cycle*: before each cycle one "
        "endpoint reports new metrics, as when the datastore rebuilds its snapshot after "
        "a scrape, so the per-snapshot work (columns, decode filter) is paid in the cycle.",
        "",
        "*Admission*: flow control's work before scheduling when nothing is queued "
        "(priority, fairness id, which endpoints have room, the queue-time count), paid by "
        "every request with flow control on (the default); off, only a sheddable request "
        "asks which endpoints have room.",
        "",
        "| endpoints | prompt | p50 µs | p99 µs | max µs | list path p50 µs | list path p99 µs "
        "| admission p50 µs | admission p99 µs |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lists = r["list_path"]
        note = ", new snapshot every cycle" if r["churn"] else ""
        lines.append(
            f"| {r['endpoints']} | {r['prompt_bytes'] // 1024} KB{note} | {r['p50_us']:.0f} "
            f"| {r['p99_us']:.0f} | {r['max_us']:.0f} | {lists['p50_us']:.0f} "
            f"| {lists['p99_us']:.0f} | {r['admission_p50_us']:.1f} "
            f"| {r['admission_p99_us']:.1f} |"
        )
    (args.out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out / (args.name + '.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
