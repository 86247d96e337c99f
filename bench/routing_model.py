"""A deterministic, virtual-time model of bench.routing: a design tool, not the benchmark.

Run: ``.venv/bin/python -m bench.routing_model`` (the routing matrix's stress setting, seconds per
cell); ``--help`` for the knobs. Writes bench/results/NAME.{md,json} (``--name``,
default routing-model).

What runs, in one process on a virtual clock (bench.virtualtime: no real sleeping, so
a 20 s cell takes a second or two of CPU and every run with the same arguments gives
the same numbers, however busy the machine is):

* the **real simulator engine** (epp_harness.sim.engine.Engine: FIFO admission,
  prefix cache, KV accounting, prefill and decode timings), one per server, with
  bench.routing's pinned settings (SimSettings, the derived ``--kv-blocks``);
* the **real scheduler**: ``epp.config.instantiate`` on a config file, behind the
  real ``epp.router.Router`` and ``epp.datastore.Datastore``, told what the EPP is
  told on the request path: ``admit`` (flow control as the config sets it, holding
  requests on the virtual clock, then snapshot, schedule, ``on_routed``, in-flight
  claim), the first token (``first_byte_seen``), the end with the server's ``usage``
  (``completed``: the latency model learns TTFT, cached tokens, slot time), the release
  and the response status;
* the **metrics scrape** as a task per server every ``--scrape-ms`` (50, the EPP's
  default interval; staggered), writing waiting, running, KV usage and
  ``cache_config_info`` into the datastore;
* **KV events** (``--kv-events``): the engine's stored and evicted blocks go straight
  into every precise-prefix-cache-scorer's index (no ZMQ, no loss), with the
  simulators' byte tokenizer scaled as bench.routing --kv-events does;
* the workload (bench.workload), the oracles (bench.oracle), warm-miss counting
  (bench.warmth) and the calibration of round robin's capacity, as bench.routing.

What it leaves out, so where it differs from bench.routing (docs/routing-model.md has
the comparison with real runs): no Envoy, HTTP, ext_proc or JSON parsing on the way
(``--hop-ms`` adds a fixed delay per request instead); no CPU contention (the real
runs share 2 cores with everything else); the scrape's own delay; KV events arrive
at once. Its numbers are for comparing designs with each other, over many seeds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import statistics
import sys
import tempfile
import time
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from bench.oracle import ORACLES, assign_groups, groups_per_server, kv_homes
from bench.routing import (
    Cell,
    Planned,
    Record,
    SimSettings,
    Workload,
    cancel_late,
    derived_kv_blocks,
    estimated_capacity,
    pct,
    running_blocks,
    visits,
)
from bench.routing import (
    build_parser as routing_parser,
)
from bench.routing_report import mean_range
from bench.virtualtime import run_virtual
from bench.warmth import WarmTracker
from bench.workload import CHARS_PER_TOKEN, KINDS, WorkloadSpec, group_weights, system_prompts
from epp.common.requestparse import parse_request
from epp.common.usage import Usage
from epp.config import builtin_registry, instantiate, load_text
from epp.datastore import Datastore
from epp.errors import ClientVisibleError
from epp.flowcontrol.controller import Waiting
from epp.flowcontrol.queues import FlowControlConfig
from epp.kvevents.index import PreciseIndex
from epp.kvevents.wire import AllBlocksCleared, BlockRemoved, BlockStored, KvEvent
from epp.observability.metrics import EppMetrics
from epp.router import Router, StreamOptions
from epp.scheduling.plugins.precise import PrecisePrefixCacheScorer
from epp.scheduling.scheduler import ProfileScheduler
from epp.types import Endpoint, EndpointMetrics
from epp_harness.sim.config import SimConfig
from epp_harness.sim.engine import Engine, PromptReport
from epp_harness.sim.kv_events import wire_hash
from epp_harness.sim.prefix_cache import BlockHash
from epp_harness.sim.protocol import ApiKind
from epp_harness.sim.protocol import parse_request as sim_parse_request
from epp_harness.sim.tokenizer import tokenized, write_tokenizer_files
from tests.support.routers import make_router

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
PATH_HEADERS = {":path": "/v1/chat/completions", ":method": "POST"}
HOST = "10.0.0.1"
BASE_PORT = 8000

# oracles that also see the servers' queues: each request goes to the least busy of its
# group's homes (running + waiting), homes as ideal-split's or shared out by the pool's KV
JSQ_ORACLES = ("ideal-split-jsq", "ideal-kv-jsq")

# the routing matrix's policies: the yardsticks and the three shipped schedulers
DEFAULT_POLICIES = (
    "round-robin",
    "default=",
    "predicted=configs/predicted-latency.yaml",
    "ideal-split",
)


# ---------------------------------------------------------------- policies


@dataclass(frozen=True)
class ModelPolicy:
    """``round-robin``, an oracle (``ideal``, ``ideal-split``), or an EPP config
    (``config`` None: the built-in default)."""

    name: str
    kind: str  # "round-robin" | "oracle" | "epp"
    config: Path | None = None

    def describe(self) -> str:
        if self.kind == "epp":
            return f"the EPP's scheduler with {self.config or 'the built-in default config'}"
        if self.kind == "oracle":
            return f"{self.name} oracle (bench/oracle.py)"
        if self.kind == "jsq":
            return f"{self.name}: the least busy of the group's homes (oracle)"
        return "round robin by request"


def parse_model_policy(text: str) -> ModelPolicy:
    """``round-robin`` | ``ideal`` | ``ideal-split`` | ``NAME=CONFIG`` (``NAME=``: the
    built-in default config)."""
    name, sep, rest = text.partition("=")
    if not sep:
        if name == "round-robin":
            return ModelPolicy(name, "round-robin")
        if name in ORACLES:
            return ModelPolicy(name, "oracle")
        if name in JSQ_ORACLES:
            return ModelPolicy(name, "jsq")
        raise argparse.ArgumentTypeError(
            f"unknown policy {name!r}: round-robin, ideal, ideal-split, ideal-split-jsq, "
            "ideal-kv-jsq or NAME=CONFIG"
        )
    config = Path(rest) if rest else None
    if config is not None and not config.exists():
        raise argparse.ArgumentTypeError(f"policy {name!r}: no config file {config}")
    return ModelPolicy(name, "epp", config)


# ---------------------------------------------------------------- the EPP side


class IndexSink:
    """The engine's KV-event sink, feeding every precise index at once (in-process:
    no wire, no loss, no delay)."""

    def __init__(self, address: str, indexes: Sequence[PreciseIndex], clock: Any) -> None:
        self.address, self.indexes, self.clock = address, indexes, clock

    def _apply(self, event: KvEvent) -> None:
        for index in self.indexes:
            index.apply(self.address, (event,), self.clock())

    def stored(
        self,
        parent: BlockHash | None,
        hashes: Sequence[BlockHash],
        token_ids: Sequence[int],
        size: int,
    ) -> None:
        self._apply(
            BlockStored(
                tuple(wire_hash(h) for h in hashes),
                None if parent is None else wire_hash(parent),
                array("q", token_ids),
                size,
                medium="GPU",
            )
        )

    def removed(self, block: BlockHash) -> None:
        self._apply(BlockRemoved((wire_hash(block),), "GPU"))

    def cleared(self) -> None:
        self._apply(AllBlocksCleared())


def load_scheduler(
    policy: ModelPolicy, clock: Any, tokenizer_dir: Path | None
) -> tuple[ProfileScheduler, FlowControlConfig]:
    """The policy's scheduler and flow control, as ``epp serve --config`` builds them
    (precise scorers get the simulators' tokenizer when none is configured, as ``epp
    stack --kv-events``)."""
    text = "" if policy.config is None else policy.config.read_text()
    source = "<default>" if policy.config is None else str(policy.config)
    if tokenizer_dir is not None and text:
        doc = yaml.safe_load(text) or {}
        for plugin in doc.get("plugins") or []:
            if plugin.get("type") == "precise-prefix-cache-scorer":
                params = plugin.setdefault("parameters", {}) or {}
                params.setdefault("tokenizer", str(tokenizer_dir))
                plugin["parameters"] = params
        text = yaml.safe_dump(doc, sort_keys=False)
    registry = builtin_registry()
    cfg = load_text(text, source, registry)
    return instantiate(cfg, registry, clock), cfg.flow_control


# ---------------------------------------------------------------- one policy's run


@dataclass
class Setting:
    """Everything a policy's run needs that does not depend on the policy."""

    sim: SimSettings
    servers: int
    workload: Workload
    kv_events: bool = False
    scrape_s: float = 0.05
    hop_s: float = 0.001
    drain_s: float = 30.0
    tokenizer_dir: Path | None = None
    slow_ms: float = 59.0


@dataclass
class Pool:
    engines: list[Engine]
    addresses: list[str]
    router: Router | None = None
    counter: int = 0
    stop: bool = False
    scrapes: list[asyncio.Task[None]] = field(default_factory=list)


def sim_config(sim: SimSettings, i: int) -> SimConfig:
    return SimConfig(
        instance_id=f"sim-{i}",
        max_num_seqs=sim.max_num_seqs,
        kv_blocks=sim.kv_blocks,
        block_size=sim.block_size,
        prefill_overhead_ms=sim.prefill_overhead_ms,
        prefill_ms_per_token=sim.prefill_ms_per_token,
        decode_ms_per_token=sim.decode_ms_per_token,
        itl_ms_per_running_seq=sim.itl_ms_per_running_seq,
        time_scale=sim.time_scale,
        enable_prompt_tokens_details=sim.enable_prompt_tokens_details,
    )


def build_pool(setting: Setting, policy: ModelPolicy) -> Pool:
    loop = asyncio.get_running_loop()
    clock = loop.time
    addresses = [f"{HOST}:{BASE_PORT + i}" for i in range(setting.servers)]
    router = None
    indexes: list[PreciseIndex] = []
    if policy.kind == "epp":
        scheduler, flow_cfg = load_scheduler(policy, clock, setting.tokenizer_dir)
        indexes = [
            p.index for p in scheduler.plugins.values() if isinstance(p, PrecisePrefixCacheScorer)
        ]
        datastore = Datastore(clock=clock)
        for address in addresses:
            host, port = address.rsplit(":", 1)
            datastore.add(Endpoint(host, int(port)))
            for index in indexes:
                index.reset(address, clock(), complete=True)
        metrics = EppMetrics(datastore, clock=clock)
        router = make_router(
            datastore,
            scheduler,
            metrics,
            stream=StreamOptions(1 << 24),
            rng=random.Random(0),
            clock=clock,
            flow=flow_cfg,
        )
    engines = []
    for i, address in enumerate(addresses):
        sink = IndexSink(address, indexes, clock) if setting.kv_events and indexes else None
        engines.append(Engine(sim_config(setting.sim, i), clock=clock, kv_events=sink))
    pool = Pool(engines, addresses, router)
    if router is not None:
        for i in range(setting.servers):
            phase = setting.scrape_s * i / setting.servers
            pool.scrapes.append(loop.create_task(scrape(pool, i, setting, phase)))
    return pool


async def scrape(pool: Pool, i: int, setting: Setting, phase: float) -> None:
    """What the EPP's scraper writes into the datastore, every ``scrape_s``."""
    assert pool.router is not None
    datastore, engine, address = pool.router.datastore, pool.engines[i], pool.addresses[i]
    clock = asyncio.get_running_loop().time
    await asyncio.sleep(phase)
    while not pool.stop:
        datastore.update_metrics(
            address,
            EndpointMetrics(
                updated_at=clock(),
                waiting=float(engine.waiting),
                running=float(engine.running),
                kv_usage=engine.kv_cache_usage,
                block_size=setting.sim.block_size,
                num_blocks=setting.sim.kv_blocks,
            ),
        )
        await asyncio.sleep(setting.scrape_s)


async def one_request(
    pool: Pool, setting: Setting, policy: ModelPolicy, p: Planned, rec: Record, index: int
) -> None:
    loop = asyncio.get_running_loop()
    router = pool.router
    routed = None
    if router is not None:
        headers = {**PATH_HEADERS, **p.headers}
        # token estimates divide by the ratio the router learned, as in `epp serve`
        request, _ = parse_request(
            f"r{index}", headers, p.data, chars_per_token=router.chars_per_token
        )
        try:  # admission (flow control, when the config turns it on), then routing
            admitted = router.admit(request, len(p.data))
            routed = await admitted.result if isinstance(admitted, Waiting) else admitted
        except ClientVisibleError as error:
            rec.error, rec.status = error.code, error.status
            return
        server = pool.addresses.index(routed.result.primary.address)
    elif policy.kind == "oracle":
        server = p.targets[policy.name]
    elif policy.kind == "jsq":
        assignment = setting.workload.assignments[policy.name]
        homes = range(len(pool.engines)) if assignment is None else assignment[p.group]
        busy = [pool.engines[s].running + pool.engines[s].waiting for s in homes]
        server = list(homes)[busy.index(min(busy))]
    else:
        server = pool.counter % len(pool.engines)
        pool.counter += 1
    rec.sent_s = loop.time() - rec.due  # the time held in flow control, if any
    if setting.hop_s:
        await asyncio.sleep(setting.hop_s)
    engine = pool.engines[server]
    req = sim_parse_request(ApiKind.CHAT, p.data, served_model="sim-model", default_max_tokens=16)
    if setting.kv_events:
        req = tokenized(req)
    report = PromptReport()
    rec.server = pool.addresses[server]
    async for token in engine.generate(req, report=report):
        if token == 0:
            rec.ttft_s = loop.time() - rec.due
            if routed is not None and router is not None:
                router.first_byte_seen(routed)
    rec.e2e_s = loop.time() - rec.due
    rec.status = 200
    cached = report.cached_tokens
    rec.cached_tokens = cached
    if routed is not None and router is not None:
        usage = Usage(req.prompt_tokens, req.max_tokens, cached or None)
        router.completed(routed, 200, "", usage)
        routed.release()
        router.response_seen(routed.ticket.address, 200)


async def run_cell(pool: Pool, setting: Setting, policy: ModelPolicy, cell: Cell) -> list[Record]:
    loop = asyncio.get_running_loop()
    start = loop.time() + 0.05
    records: list[Record] = []
    tasks = []
    for i, p in enumerate(cell.requests):
        due = start + p.offset_s
        if due > loop.time():
            await asyncio.sleep(due - loop.time())
        rec = Record(p.group, p.max_tokens, due)
        records.append(rec)
        tasks.append(loop.create_task(one_request(pool, setting, policy, p, rec, i)))
    await cancel_late(tasks, records, start + cell.duration + setting.drain_s)
    return records


def summarize(
    policy: str, cell: Cell, records: list[Record], hits: float, slow_ms: float
) -> dict[str, Any]:
    ok = [r for r in records if r.error is None]
    ttft = sorted(r.ttft_s * 1000 for r in ok if r.ttft_s is not None)
    slow = sum(1 for t in ttft if t > slow_ms) / len(ttft) if ttft else math.nan
    done = sum(
        1
        for p, r in zip(cell.requests, records, strict=True)
        if r.error is None
        and r.e2e_s is not None
        and cell.duration / 4 <= p.offset_s + r.e2e_s
        and p.offset_s + r.e2e_s < cell.duration
    )
    per_server: dict[str, int] = {}
    for r in records:
        per_server[r.server] = per_server.get(r.server, 0) + 1
    mean = sum(per_server.values()) / max(len(per_server), 1)
    return {
        "policy": policy,
        "rate": cell.rate,
        "sent": len(records),
        "errors": len(records) - len(ok),
        "throughput_rps": done / (cell.duration * 3 / 4),
        "ttft_p50_ms": pct(ttft, 0.5),
        "ttft_p90_ms": pct(ttft, 0.9),
        "ttft_p99_ms": pct(ttft, 0.99),
        "slow_share": slow,
        "prefix_hit_rate": hits,
        "load_max_mean": max(per_server.values()) / mean if mean else math.nan,
    }


async def run_policy(
    setting: Setting, policy: ModelPolicy, warmup: Cell | None, cells: list[Cell]
) -> list[dict[str, Any]]:
    pool = build_pool(setting, policy)
    chars = 1 if setting.kv_events else CHARS_PER_TOKEN
    warm = WarmTracker(setting.sim.block_size, chars)
    rows = []
    try:
        if warmup is not None and warmup.requests:
            warm.account(visits(warmup, await run_cell(pool, setting, policy, warmup)))
        for cell in cells:
            q0 = sum(e.counters.prefix_cache_queries_tokens for e in pool.engines)
            h0 = sum(e.counters.prefix_cache_hits_tokens for e in pool.engines)
            records = await run_cell(pool, setting, policy, cell)
            q1 = sum(e.counters.prefix_cache_queries_tokens for e in pool.engines)
            h1 = sum(e.counters.prefix_cache_hits_tokens for e in pool.engines)
            hits = (h1 - h0) / (q1 - q0) if q1 > q0 else 0.0
            row = summarize(policy.name, cell, records, hits, setting.slow_ms)
            count = warm.account(visits(cell, records))
            row["warm_miss_rate"] = count.miss_rate
            rows.append(row)
    finally:
        await stop_pool(pool)
    return rows


async def stop_pool(pool: Pool) -> None:
    """Stop the pool's scrapes."""
    pool.stop = True
    for task in pool.scrapes:
        task.cancel()
    await asyncio.gather(*pool.scrapes, return_exceptions=True)


async def calibrate(setting: Setting, cell: Cell, mean_output: float) -> float:
    """Round robin's capacity, as bench.routing measures it: output tokens completed in
    the last two thirds of an overload run / the mean output length."""
    policy = ModelPolicy("calibration", "round-robin")
    pool = build_pool(setting, policy)
    records = await run_cell(pool, replace(setting, drain_s=0.0), policy, cell)
    t0, t1 = cell.duration / 3, cell.duration
    tokens = sum(
        p.max_tokens
        for p, r in zip(cell.requests, records, strict=True)
        if r.error is None and r.e2e_s is not None and t0 <= p.offset_s + r.e2e_s < t1
    )
    return tokens / (t1 - t0) / mean_output


# ---------------------------------------------------------------- setting and main


def make_setting(args: argparse.Namespace) -> Setting:
    spec = WorkloadSpec(
        groups=args.groups,
        prefix_tokens=args.prefix_tokens,
        question_tokens=(args.question_tokens[0], args.question_tokens[1]),
        output_tokens=(args.output_tokens[0], args.output_tokens[1]),
        skew=args.skew,
    )
    kv_blocks = args.kv_blocks or derived_kv_blocks(
        spec, args.servers, args.max_num_seqs, args.block_size, args.prefix_copies
    )
    timing = routing_parser().parse_args([])  # bench.routing's pinned simulator timings
    sim = SimSettings(
        max_num_seqs=args.max_num_seqs,
        kv_blocks=kv_blocks,
        block_size=args.block_size,
        prefill_overhead_ms=timing.prefill_overhead_ms,
        prefill_ms_per_token=timing.prefill_ms_per_token,
        decode_ms_per_token=timing.decode_ms_per_token,
        itl_ms_per_running_seq=timing.itl_ms_per_running_seq,
    )
    prefix_blocks = math.ceil(args.prefix_tokens / args.block_size)
    free = kv_blocks - running_blocks(spec, args.max_num_seqs, args.block_size)
    per_server = groups_per_server(free, prefix_blocks)
    weights = group_weights(spec.groups, spec.skew)
    copies = args.servers * per_server
    built = {
        "ideal": assign_groups(weights, args.servers, per_server),
        "ideal-split": assign_groups(weights, args.servers, per_server, split=True),
        "ideal-kv-jsq": assign_groups(
            weights,
            args.servers,
            per_server,
            counts=[kv_homes(w, args.servers, copies) for w in weights],
        ),
    }
    built["ideal-split-jsq"] = built["ideal-split"]
    assignments = {n: None if args.workload == "control" else a for n, a in built.items()}
    workload = Workload(args.workload, spec, system_prompts(spec), assignments, args.servers)
    tokenizer_dir = None
    if args.kv_events:
        sim = replace(
            sim,
            block_size=sim.block_size * CHARS_PER_TOKEN,
            prefill_ms_per_token=sim.prefill_ms_per_token / CHARS_PER_TOKEN,
        )
        tokenizer_dir = write_tokenizer_files(Path(tempfile.mkdtemp(prefix="routing-model-")))
    return Setting(
        sim,
        args.servers,
        workload,
        kv_events=args.kv_events,
        scrape_s=args.scrape_ms / 1000,
        hop_s=args.hop_ms / 1000,
        tokenizer_dir=tokenizer_dir,
        slow_ms=args.slow_ms,
    )


def run_seed(
    setting: Setting, policies: Sequence[ModelPolicy], loads: Sequence[float], args: Any, seed: int
) -> tuple[float, list[dict[str, Any]]]:
    spec = setting.workload.spec
    estimate = estimated_capacity(spec, setting.servers, setting.sim)
    if args.capacity:
        capacity = args.capacity
    else:
        cal = setting.workload.cell(1.5 * estimate, args.calibrate, seed + 2000)
        capacity = run_virtual(calibrate(setting, cal, mean_range(spec.output_tokens)))
    rates = sorted(round(load * capacity, 1) for load in loads)
    cells = [setting.workload.cell(r, args.duration, seed + i) for i, r in enumerate(rates)]
    warmup = setting.workload.cell(rates[0], args.warmup, seed + 1000) if args.warmup else None
    rows = []
    for policy in policies:
        for load, row in zip(
            sorted(loads), run_virtual(run_policy(setting, policy, warmup, cells)), strict=True
        ):
            rows.append({**row, "load": load, "seed": seed})
    return capacity, rows


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.routing_model",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = p.add_argument
    add(
        "--policy",
        dest="policies",
        action="append",
        type=parse_model_policy,
        metavar="SPEC",
        help="round-robin | ideal | ideal-split | NAME=CONFIG (NAME=: the built-in "
        "default); repeatable; default: " + ", ".join(DEFAULT_POLICIES),
    )
    add("--seeds", type=int, nargs="+", default=[1, 2, 3, 4], help="workload seeds")
    add("--loads", type=float, nargs="+", default=[0.4, 0.7, 0.95, 1.2])
    add("--duration", type=float, default=20.0, help="virtual seconds of arrivals per load")
    add("--warmup", type=float, default=5.0)
    add("--calibrate", type=float, default=10.0, help="virtual seconds of calibration")
    add("--capacity", type=float, default=None, help="round robin's capacity (no calibration)")
    add("--servers", type=int, default=4)
    add("--workload", choices=KINDS, default="groups")
    add("--groups", type=int, default=16)
    add("--prefix-tokens", type=int, default=1500)
    add("--question-tokens", type=int, nargs=2, default=[75, 225])
    add("--output-tokens", type=int, nargs=2, default=[16, 48])
    add("--skew", type=float, default=1.1)
    add("--max-num-seqs", type=int, default=4)
    add("--kv-blocks", type=int, default=None)
    add("--prefix-copies", type=float, default=1.6)
    add("--block-size", type=int, default=16)
    add("--kv-events", action="store_true", help="engines feed precise scorers' indexes")
    add("--scrape-ms", type=float, default=50.0, help="scrape interval per server")
    add("--hop-ms", type=float, default=1.0, help="fixed delay from routing to the engine")
    add(
        "--slow-ms",
        type=float,
        default=59.0,
        help="report the share of requests slower than this (default: 1/3 of round "
        "robin's ~177 ms p90 at 40-70 %% load: the routing target)",
    )
    add("--name", default="routing-model")
    add("--out", type=Path, default=RESULTS)
    return p


def aggregate(rows: list[dict[str, Any]], key: str) -> dict[tuple[str, float], list[float]]:
    out: dict[tuple[str, float], list[float]] = {}
    for r in rows:
        out.setdefault((r["policy"], r["load"]), []).append(r[key])
    return out


def fmt(values: list[float], scale: float = 1.0, digits: int = 0) -> str:
    finite = [v * scale for v in values if not math.isnan(v)]
    if not finite:
        return "-"
    mean = statistics.fmean(finite)
    if len(finite) == 1:
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ({min(finite):.{digits}f}-{max(finite):.{digits}f})"


def ratio_table(
    rows: list[dict[str, Any]],
    seeds: list[int],
    policies: list[str],
    loads: list[float],
    key: str,
    title: str,
    ref: str,
) -> list[str]:
    """``key`` of each policy as a multiple of ``ref``'s, the mean of per-seed ratios."""
    by_seed = {(r["policy"], r["load"], r["seed"]): r[key] for r in rows}
    lines = [f"## {title} (mean of per-seed ratios)", ""]
    lines += ["| policy | " + " | ".join(f"{x:g}" for x in loads) + " |"]
    lines.append("|---|" + "---:|" * len(loads))
    for pol in policies:
        cells = []
        for x in loads:
            ratios = [
                by_seed[(pol, x, s)] / by_seed[(ref, x, s)]
                for s in seeds
                if by_seed.get((ref, x, s))
            ]
            cells.append(f"{statistics.fmean(ratios):.2f}x" if ratios else "-")
        lines.append(f"| {pol} | " + " | ".join(cells) + " |")
    lines.append("")
    return lines


def markdown(meta: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    loads = sorted({r["load"] for r in rows})
    lines = [
        f"# Routing model ({meta['workload']} workload, KV {meta['prefix_copies']} copies)",
        "",
        "Virtual-time model (bench/routing_model.py), not the benchmark: the real "
        "scheduler and simulator engine on a virtual clock; see docs/routing-model.md.",
        "",
        f"    {meta['command']}",
        "",
        f"Seeds {meta['seeds']}; round-robin capacity per seed {meta['capacities']} req/s; "
        f"{meta['duration']:g} s per load; kv-blocks {meta['kv_blocks']}. Cells: mean over "
        "seeds (min-max).",
        "",
    ]
    for key, title, scale, digits in (
        ("ttft_p90_ms", "TTFT p90 ms", 1.0, 0),
        ("ttft_p50_ms", "TTFT p50 ms", 1.0, 0),
        ("ttft_p99_ms", "TTFT p99 ms", 1.0, 0),
        ("slow_share", f"TTFT above {meta['slow_ms']:g} ms, % of requests", 100.0, 1),
        ("warm_miss_rate", "warm misses %", 100.0, 0),
        ("throughput_rps", "achieved req/s", 1.0, 1),
        ("prefix_hit_rate", "the servers' own prefix-cache hit rate %", 100.0, 1),
    ):
        agg = aggregate(rows, key)
        lines += [f"## {title}", "", "| policy | " + " | ".join(f"{x:g}" for x in loads) + " |"]
        lines.append("|---|" + "---:|" * len(loads))
        for pol in policies:
            cells = [fmt(agg.get((pol, x), []), scale, digits) for x in loads]
            lines.append(f"| {pol} | " + " | ".join(cells) + " |")
        lines.append("")
    for key, title, ref in (
        ("ttft_p50_ms", "TTFT p50 / round robin's", "round-robin"),
        ("ttft_p90_ms", "TTFT p90 / round robin's", "round-robin"),
        ("throughput_rps", "achieved req/s / round robin's", "round-robin"),
        ("prefix_hit_rate", "prefix-cache hit rate / the ideal oracle's", "ideal"),
    ):
        if ref in policies:
            lines += ratio_table(rows, meta["seeds"], policies, loads, key, title, ref)
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    policies = args.policies or [parse_model_policy(p) for p in DEFAULT_POLICIES]
    setting = make_setting(args)
    began = time.monotonic()
    rows: list[dict[str, Any]] = []
    capacities = []
    for seed in args.seeds:
        capacity, seed_rows = run_seed(setting, policies, args.loads, args, seed)
        capacities.append(round(capacity, 1))
        rows += seed_rows
        for r in seed_rows:
            print(
                f"seed {seed} {r['policy']:>14} load {r['load']:4} rate {r['rate']:5.1f}: "
                f"p50 {r['ttft_p50_ms']:6.0f} p90 {r['ttft_p90_ms']:6.0f} "
                f"p99 {r['ttft_p99_ms']:6.0f} ms, slow {r['slow_share']:.1%}, "
                f"warm miss {r['warm_miss_rate']:.0%}, "
                f"{r['throughput_rps']:.1f} req/s",
                flush=True,
            )
    meta = {
        "command": ".venv/bin/python -m bench.routing_model"
        + "".join(f" {a}" for a in (sys.argv[1:] if argv is None else argv)),
        "seeds": args.seeds,
        "capacities": capacities,
        "duration": args.duration,
        "workload": args.workload,
        "prefix_copies": args.prefix_copies,
        "kv_blocks": setting.sim.kv_blocks,
        "slow_ms": args.slow_ms,
        "policies": {p.name: p.describe() for p in policies},
        "elapsed_s": round(time.monotonic() - began, 1),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.md").write_text(markdown(meta, rows))
    (args.out / f"{args.name}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print(f"done in {meta['elapsed_s']} s: {args.out / args.name}.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
