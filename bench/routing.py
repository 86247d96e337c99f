"""Routing quality: TTFT, cache use and load balance of scheduling policies.

Run: ``.venv/bin/python -m bench.routing`` (~5 min) or ``--quick`` (~1 min smoke run);
``make bench-routing`` runs the routing matrix (see the Makefile).
Writes bench/results/routing.{md,json} and routing_ttft.png / routing_load.png
(``--quick``: routing-quick.*; ``--per-request`` adds every request's result).

What runs. For each policy, in turn and against the same fresh simulators' settings:

* ``round-robin``: Envoy alone with a static round-robin cluster (no EPP).
* ``least-request``: Envoy + ``epp serve --config configs/least-request.yaml`` (least
  outstanding requests; plain ``epp serve`` where that file does not exist).
* ``ideal``: the reference. Envoy alone with an ORIGINAL_DST cluster (no EPP); the load
  generator names each request's server in ``x-gateway-destination-endpoint``, from an
  oracle that knows the request's group (bench/oracle.py): each server keeps a fixed
  share of the groups, at most as many as its free KV holds under load, balanced by
  longest-processing-time-first on the groups' Zipf weights. Multi-turn: a session goes
  to its group's server. Control: there are no groups, so it is round robin by request.
* ``ideal-split``: as ``ideal``, but a group heavier than a server's fair share gets
  several homes (one prefix copy each) and its requests take turns over them (a session
  keeps one): ``ideal`` leaves the top Zipf group's server ~1.3x busier than the mean,
  so past ~0.7 of capacity that server queues and ``ideal`` stops being the best case.
* ``NAME=ARGS`` (``--policy``, repeatable): Envoy + ``epp serve ARGS`` (shell-split), e.g.
  ``--policy "random=--config configs/random.yaml"``. ``NAME=`` is plain
  ``epp serve``. ``--replicas N`` among the ARGS starts N such ``epp serve`` processes
  (active-active replicas, each its own endpoint of Envoy's ext_proc cluster, each
  following the same simulators: docs/replicas.md), e.g. ``--policy "precise-2=--replicas 2
  --config configs/precise-prefix.yaml"``. Without ``--policy`` the policies are
  round-robin, least-request and ``default=`` (plain ``epp serve``).

Every policy gets ``--servers`` *fresh* simulators (cold caches), then ``--warmup``
seconds of unmeasured load at the lowest rate (so each policy fills the caches its own
way), then each rate in increasing order, with the caches carried over from rate to
rate. Every policy sees exactly the same requests at the same times (the workload is
seeded), so the only difference between policies is where requests went.

The load is open-loop (bench/workload.py, ``--workload``): Poisson arrivals, each request
sent at its arrival time whatever happens to earlier ones, as a streaming chat
completion. ``groups`` (default): requests share their group's system prompt;
``control``: every prompt is unique (no prefix to reuse: least request is the yardstick);
``multi-turn``: chat sessions resending their history, ``x-session-id`` header. TTFT is
measured from the *scheduled* arrival time (so a lagging client cannot hide queueing)
to the first SSE chunk with non-empty ``delta.content``; e2e to the end of the stream.
After ``--duration`` seconds of arrivals, outstanding requests get ``--drain-timeout``
seconds, then are cancelled and counted as errors (``timeout``).

Warm misses (bench/warmth.py): every response's final usage chunk carries
``usage.prompt_tokens_details.cached_tokens``. A request whose prefix (its group's system
prompt; multi-turn: its session's previous turn) an earlier request of the run had
already prefilled (warm-up included) is *warm*; a warm request whose cached tokens fall
short of the prefix's full KV blocks is a *warm miss*: it paid that prefill again.

Simulator settings are pinned: every ``epp sim`` flag that moves latency or caching is
passed explicitly (``SimSettings.argv``: the ones below plus ``--time-scale=1.0`` and
``--enable-prompt-tokens-details``, which the warm-miss count needs), so a later change
of the simulator's defaults cannot move a baseline unnoticed; a new such flag belongs in
``SimSettings`` too. Each a flag here, and why:

* ``--max-num-seqs 8``: finite capacity per server; beyond it requests queue FIFO, so
  piling load on one server shows up as queueing in TTFT.
* ``--prefill-ms-per-token 0.1`` (10k tokens/s, ``--prefill-overhead-ms 5``): an
  uncached 1500-token system prompt costs ~150 ms more prefill than a cached one
  (~5 ms + the question), about a fifth of a request's service time. So the cache
  decides TTFT at low load and also capacity (slot time) near saturation.
* ``--decode-ms-per-token 8``, ``--itl-ms-per-running-seq 0.5`` (the simulator's
  defaults): ~12 ms per output token with 8 running sequences.
* ``--max-num-batched-tokens 0``: per-request timing, no step-level prefill/decode
  interference (the timing every committed baseline was measured with; ``bench.pd``
  measures the interference).
* ``--kv-blocks`` (default: derived): the running working set (max-num-seqs x blocks of
  a mean request) plus ``--prefix-copies`` (1.25) x the prefixes of groups/servers
  groups. With the defaults: 8 x 105 + 1.25 x 4 x 94 = 1310 blocks, fewer than the
  16 x 94 = 1504 blocks all groups' prefixes need, so one server can never cache every
  group; a loaded server caches about a quarter of the groups (the pool as a whole 1.25
  copies of every prefix), which is exactly what a scheduler that keeps each group on
  one of 4 servers asks of it, while a server that sees all 16 groups (round robin)
  keeps evicting prefixes. This is the stress setting: a popular group has no room for
  a second home. ``--prefix-copies 2`` (1592 blocks: a loaded server caches half the
  groups, the pool two copies of each) is the roomier setting that
  bench/results/routing-roomy.md reports. The matrix's setting (``make
  bench-routing``): ``--max-num-seqs 4`` and 1.6 copies, so a loaded server's
  free KV holds 6 of the 16 groups' prefixes; 2.5 copies (10 groups) is its roomier
  variant. The derivation assumes a groups request; multi-turn prompts grow with their
  history, so there the running sequences hold more and the cache keeps less.

Rates: ``--loads`` (default 0.4 0.6 0.8 1.0 1.2) are fractions of round robin's capacity,
measured first by a calibration run (``--calibrate`` seconds of Envoy alone round robin
on fresh simulators at 1.5x the capacity the latency model predicts, see
``estimated_capacity``), so the list reaches beyond saturation whatever the flags;
``--rates`` gives absolute req/s instead (no calibration). The report's "reading"
compares policies at the rate closest to 80 % of that capacity (of round robin's best
achieved throughput without a calibration).

Everything (Envoy, EPP, simulators and this load generator) shares the machine's cores:
the report records each component's CPU use per rate so a saturated machine is visible.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import re
import shlex
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol, TypeVar

import aiohttp
import orjson

from bench.host import cpu_seconds, git_state, machine_cpu, machine_description
from bench.oracle import (
    ORACLES,
    Assignment,
    assign_groups,
    destination,
    groups_per_server,
    server_loads,
)
from bench.routing_report import mean_range, percent, write_results
from bench.warmth import Visit, WarmTracker
from bench.workload import (
    CHARS_PER_TOKEN,
    KINDS,
    SESSION_HEADER,
    Kind,
    WorkloadSpec,
    generate,
    group_weights,
    system_prompts,
)
from epp.common import argtypes
from epp.extproc.messages import DESTINATION_HEADER
from epp_harness.envoyconfig import (
    PROCESSING_MODES,
    Processing,
)
from epp_harness.procs import scratch_dir
from epp_harness.stack import LocalStack, StackOptions

RESULTS = Path(__file__).resolve().parent / "results"
HEADERS = {"content-type": "application/json"}
TAIL_BYTES = 1024  # enough for the usage chunk and [DONE] at the end of a stream

REPO = Path(__file__).resolve().parents[1]
LEAST_REQUEST_CONFIG = REPO / "configs" / "least-request.yaml"


def least_request_args() -> list[str]:
    """`epp serve` arguments of the built-in least-request policy: the least-request
    config where the tree has one (plain `epp serve` then schedules otherwise), else
    plain `epp serve` (the walking skeleton, which was least outstanding requests)."""
    if LEAST_REQUEST_CONFIG.exists():
        return ["--config", os.path.relpath(LEAST_REQUEST_CONFIG)]
    return []


DEFAULT_POLICIES = ["round-robin", "least-request", "default="]

T = TypeVar("T")


# ---------------------------------------------------------------- policies and settings


@dataclass(frozen=True)
class Policy:
    name: str
    epp_args: tuple[str, ...] | None  # None: Envoy alone (round robin, or an oracle)
    oracle: str | None = None  # ideal, ideal-split: the load generator names the server
    replicas: int = 1  # `epp serve` processes side by side (--replicas N in the args)

    def describe(self) -> str:
        if self.oracle == "ideal-split":
            return (
                "as ideal, but a group above a fair share of the traffic has several "
                "homes (one prefix copy each), its requests (sessions) spread over them"
            )
        if self.oracle:
            return (
                "Envoy alone, ORIGINAL_DST cluster, no EPP: the load generator sets "
                "`x-gateway-destination-endpoint` from an oracle (bench/oracle.py: each "
                "server a fixed, KV-sized share of the groups, balanced by "
                "longest-processing-time-first on their Zipf weights; multi-turn: a "
                "session's server is its group's; control: round robin by request)"
            )
        if self.epp_args is None:
            return "Envoy alone, static ROUND_ROBIN cluster, no EPP"
        serve = "`epp serve" + "".join(f" {shlex.quote(a)}" for a in self.epp_args) + "`"
        if self.replicas > 1:
            return f"Envoy + {self.replicas} replicas of {serve}, Envoy spreading streams over them"
        return f"Envoy + {serve}"


def parse_policy(text: str) -> Policy:
    """``round-robin`` | ``least-request`` | ``ideal`` | ``ideal-split`` |
    ``NAME=EPP SERVE ARGS`` (``NAME=``: no args)."""
    name, sep, rest = text.partition("=")
    name = name.strip()
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.+-]*", name):
        raise argparse.ArgumentTypeError(f"policy name must be [A-Za-z0-9_.+-]+, got {name!r}")
    if name == "round-robin" or name in ORACLES:
        if sep:
            raise argparse.ArgumentTypeError(f"{name} is Envoy alone: it takes no EPP args")
        return Policy(name, None, oracle=name if name in ORACLES else None)
    if not sep:
        if name == "least-request":
            return Policy(name, tuple(least_request_args()))
        raise argparse.ArgumentTypeError(
            f"unknown policy {name!r}: use round-robin, least-request, ideal, ideal-split "
            "or NAME=EPP_SERVE_ARGS"
        )
    try:
        args = shlex.split(rest)
        replicas = take_replicas(args)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"policy {name!r}: {exc}") from None
    return Policy(name, tuple(args), replicas=replicas)


def take_replicas(args: list[str]) -> int:
    """Remove ``--replicas N`` (or ``--replicas=N``) from ``args``; N (1 without it).
    ValueError unless N is a positive integer."""
    for i, arg in enumerate(args):
        flag, eq, value = arg.partition("=")
        if flag != "--replicas":
            continue
        if not eq:
            if i + 1 == len(args):
                raise ValueError("--replicas needs a number")
            value = args.pop(i + 1)
        del args[i]
        if not value.isdigit() or int(value) < 1:
            raise ValueError(f"--replicas {value!r}: give a positive integer")
        return int(value)
    return 1


@dataclass(frozen=True)
class SimSettings:
    """Every `epp sim` setting that moves latency or caching, passed explicitly (see the
    module docstring: a change of the simulator's defaults must not move a baseline)."""

    max_num_seqs: int
    kv_blocks: int
    block_size: int
    prefill_overhead_ms: float
    prefill_ms_per_token: float
    decode_ms_per_token: float
    itl_ms_per_running_seq: float
    time_scale: float = 1.0
    # 0: per-request timing, as every committed baseline (no chunked-prefill interference)
    max_num_batched_tokens: int = 0
    # usage.prompt_tokens_details.cached_tokens: the warm-miss count reads it
    enable_prompt_tokens_details: bool = True

    def argv(self) -> list[str]:
        out = []
        for name, value in self.__dict__.items():
            flag = f"--{name.replace('_', '-')}"
            if isinstance(value, bool):
                if not value:  # a switch that is off by default: nothing to pass
                    continue
                out.append(flag)
            else:
                out.append(f"{flag}={value}")
        return out


def derived_kv_blocks(
    spec: WorkloadSpec, servers: int, max_num_seqs: int, block_size: int, copies: float = 1.25
) -> int:
    """Running working set + ``copies`` x the prefixes of one server's share of the
    groups (so the pool's free KV holds ``copies`` copies of every group's prefix)."""
    prefix_blocks = math.ceil(spec.prefix_tokens / block_size)
    share = math.ceil(spec.groups / servers)
    return running_blocks(spec, max_num_seqs, block_size) + math.ceil(
        copies * share * prefix_blocks
    )


def estimated_capacity(spec: WorkloadSpec, servers: int, sim: SimSettings) -> float:
    """Requests/s all servers finish when every slot is busy and no prompt is cached."""
    itl_ms = sim.decode_ms_per_token + sim.itl_ms_per_running_seq * sim.max_num_seqs
    prompt = spec.prefix_tokens + mean_range(spec.question_tokens)
    prefill_ms = sim.prefill_overhead_ms + sim.prefill_ms_per_token * prompt
    service_s = (prefill_ms + (mean_range(spec.output_tokens) - 1) * itl_ms) / 1000
    return servers * sim.max_num_seqs / service_s


# ---------------------------------------------------------------- processes


class Deployment(LocalStack):
    """One policy's stack: fresh simulators, ``epp serve`` with the policy's arguments
    (or none: Envoy alone, round robin or routed by the client's destination header),
    Envoy with one worker thread."""

    def __init__(
        self,
        policy: Policy,
        workdir: Path,
        servers: int,
        sim: SimSettings,
        processing: Processing,
        model: str,
        kv_events: bool = False,
    ) -> None:
        super().__init__(
            StackOptions(
                servers=servers,
                model=model,
                envoy_port=0,
                envoy_admin_port=0,
                grpc_port=0,
                http_port=0,
                processing=processing,
                sim_args=sim.argv(),
                epp_args=list(policy.epp_args or []),
                log_level="warning",
                workdir=workdir,
                epp=policy.epp_args is not None,
                cluster="original-dst" if policy.oracle else "eds",
                envoy_concurrency=1,
                kv_events=kv_events,
                replicas=policy.replicas,
            )
        )
        self.policy = policy

    @property
    def url(self) -> str:
        assert self.envoy is not None
        return f"http://127.0.0.1:{self.envoy.port}/v1/chat/completions"

    @property
    def replica_metrics_urls(self) -> list[str]:
        """Every EPP replica's /metrics (none without an EPP)."""
        return [f"http://127.0.0.1:{http}/metrics" for _, http in self.epp_ports]

    def pids(self) -> dict[str, list[int]]:
        assert self.envoy is not None
        pids = {
            "sims": [s.pid for s in self.sims],
            "envoy": [self.envoy.process.pid],
            "loadgen": [os.getpid()],
        }
        if self.epp is not None:
            pids["epp"] = [p.pid for p in (self.epp, *self.more_epps)]
        return pids


# ---------------------------------------------------------------- load generator


@dataclass(slots=True)
class Record:
    group: int
    max_tokens: int
    due: float = 0.0  # the event loop's time the request was scheduled for
    lag_s: float = 0.0
    status: int = 0
    server: str = ""
    ttft_s: float | None = None
    e2e_s: float | None = None
    error: str | None = None
    cached_tokens: int | None = None  # from the final usage chunk; None: none seen
    sent_s: float | None = None  # from due to leaving for its server (bench.routing_model)


@dataclass(frozen=True, slots=True)
class Planned:
    """One request of a cell, ready to send: the workload's request (bench.workload's
    TimedRequest) as bytes, and the server each oracle policy picks for it."""

    offset_s: float
    data: bytes
    group: int
    max_tokens: int
    headers: dict[str, str]
    warm_prefixes: tuple[tuple[str, int], ...]
    marks: tuple[str, ...]
    targets: dict[str, int]  # oracle name -> index into the deployment's simulators


@dataclass
class Cell:
    """One rate's requests in arrival order."""

    rate: float
    duration: float
    requests: list[Planned] = field(default_factory=list)


def _has_content(event: bytes) -> bool:
    if not event.startswith(b"data: {"):
        return False
    try:
        choices = orjson.loads(event[6:]).get("choices") or []
    except orjson.JSONDecodeError:
        return False
    return any((c.get("delta") or {}).get("content") or c.get("text") for c in choices)


def final_usage(tail: bytes) -> dict[str, Any]:
    """The ``usage`` object of the stream's last usage chunk ({} when there is none)."""
    for event in reversed(tail.split(b"\n\n")):
        if event.startswith(b"data: {") and b'"usage"' in event:
            try:
                usage = orjson.loads(event[6:]).get("usage")
            except orjson.JSONDecodeError:
                return {}
            return usage if isinstance(usage, dict) else {}
    return {}


def cached_tokens(usage: dict[str, Any]) -> int | None:
    """``prompt_tokens_details.cached_tokens`` of a usage object. The simulators run with
    --enable-prompt-tokens-details, where vLLM leaves the details null when nothing was
    cached: that is 0. None when the usage itself is missing."""
    if "prompt_tokens" not in usage:
        return None
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return cached if isinstance(cached, int) else None


async def one_request(
    session: aiohttp.ClientSession,
    url: str,
    data: bytes,
    headers: dict[str, str],
    rec: Record,
) -> None:
    loop = asyncio.get_running_loop()
    due = rec.due
    rec.lag_s = loop.time() - due
    try:
        async with session.post(url, data=data, headers=headers) as resp:
            rec.status = resp.status
            rec.server = resp.headers.get("x-sim-instance", "")
            if resp.status != 200:
                await resp.read()
                rec.error = f"http-{resp.status}"
                return
            pending = b""
            tail = b""
            async for chunk in resp.content.iter_any():
                if rec.ttft_s is None:
                    pending += chunk
                    while (end := pending.find(b"\n\n")) >= 0:
                        event, pending = pending[:end], pending[end + 2 :]
                        if _has_content(event):
                            rec.ttft_s = loop.time() - due
                            tail = pending
                            break
                else:
                    tail = (tail + chunk)[-TAIL_BYTES:]
            rec.e2e_s = loop.time() - due
        usage = final_usage(tail)
        rec.cached_tokens = cached_tokens(usage)
        if rec.ttft_s is None:
            rec.error = "no-content"
        elif not tail.rstrip().endswith(b"data: [DONE]"):
            rec.error = "truncated"
        elif usage.get("completion_tokens") != rec.max_tokens:
            rec.error = "short"
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        rec.error = type(exc).__name__


async def run_cell(
    session: aiohttp.ClientSession,
    url: str,
    cell: Cell,
    drain_timeout: float,
    oracle: tuple[str, list[str]] | None = None,
) -> list[Record]:
    """Send every request at its time; wait for them (bounded). With ``oracle`` (name,
    servers) each request names ``servers[its target for that oracle]`` in its
    destination header."""
    loop = asyncio.get_running_loop()
    start = loop.time() + 0.05
    records: list[Record] = []
    tasks: list[asyncio.Task[None]] = []
    for p in cell.requests:
        due = start + p.offset_s
        delay = due - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        headers = {**HEADERS, **p.headers}
        if oracle is not None:
            headers[DESTINATION_HEADER] = oracle[1][p.targets[oracle[0]]]
        rec = Record(p.group, p.max_tokens, due)
        records.append(rec)
        tasks.append(loop.create_task(one_request(session, url, p.data, headers, rec)))
    await cancel_late(tasks, records, start + cell.duration + drain_timeout)
    return records


class Timed(Protocol):
    error: str | None
    e2e_s: float | None


async def cancel_late(
    tasks: Sequence[asyncio.Task[Any]], records: Sequence[Timed], deadline: float
) -> None:
    """Wait for ``tasks`` (one per record) until ``deadline`` (the loop's time); cancel
    the rest and count their records as ``timeout`` errors."""
    if not tasks:
        return
    loop = asyncio.get_running_loop()
    _, pending = await asyncio.wait(tasks, timeout=max(0.0, deadline - loop.time()))
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    for rec, task in zip(records, tasks, strict=True):
        if task in pending:
            rec.error, rec.e2e_s = "timeout", None


async def sim_stats(session: aiohttp.ClientSession, urls: list[str]) -> list[dict[str, Any]]:
    async def one(url: str) -> dict[str, Any]:
        async with session.get(f"{url}/sim/stats") as resp:
            stats: dict[str, Any] = await resp.json()
            return stats

    return list(await asyncio.gather(*(one(u) for u in urls)))


async def replica_requests(session: aiohttp.ClientSession, urls: list[str]) -> list[int]:
    """Each EPP replica's ``epp_requests_total`` (every label summed)."""

    async def one(url: str) -> int:
        async with session.get(url) as resp:
            text = await resp.text()
        return round(
            sum(
                float(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                if line.startswith(("epp_requests_total{", "epp_requests_total "))
            )
        )

    return list(await asyncio.gather(*(one(u) for u in urls)))


def cpu_snapshot(pids: dict[str, list[int]]) -> dict[str, float]:
    snap = {name: sum(cpu_seconds(p) for p in ps) for name, ps in pids.items()}
    snap["_busy"], snap["_total"] = machine_cpu()
    snap["_wall"] = time.monotonic()
    return snap


def client_session() -> aiohttp.ClientSession:
    """Keep-alive, unlimited connections (open loop: never queue in the client)."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, enable_cleanup_closed=True),
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
        auto_decompress=False,
    )


class Target(Protocol):
    """What :func:`drive` sends to: a :class:`Deployment`, or real servers behind Envoy
    (bench.vllm_routing)."""

    policy: Policy
    sim_addresses: list[str]  # the model servers, as the oracles name them
    sim_urls: list[str]  # their base URLs, for ``stats``

    @property
    def url(self) -> str: ...

    @property
    def replica_metrics_urls(self) -> list[str]: ...

    def pids(self) -> dict[str, list[int]]: ...


# Each server's counters, as /sim/stats names them (summarize reads the prefix cache's)
Stats = Callable[[aiohttp.ClientSession, list[str]], Awaitable[list[dict[str, Any]]]]


async def drive(
    dep: Target,
    warmup: Cell | None,
    cells: list[Cell],
    drain_timeout: float,
    warm: WarmTracker,
    stats: Stats = sim_stats,
) -> list[dict[str, Any]]:
    rows = []
    oracle = (dep.policy.oracle, dep.sim_addresses) if dep.policy.oracle else None
    async with client_session() as session:
        if warmup is not None and warmup.requests:
            print(f"    warmup {warmup.rate:g} req/s for {warmup.duration:g} s", flush=True)
            records = await run_cell(session, dep.url, warmup, drain_timeout, oracle)
            warm.account(visits(warmup, records))
        for cell in cells:
            stats0, cpu0 = await stats(session, dep.sim_urls), cpu_snapshot(dep.pids())
            handled0 = await replica_requests(session, dep.replica_metrics_urls)
            records = await run_cell(session, dep.url, cell, drain_timeout, oracle)
            stats1, cpu1 = await stats(session, dep.sim_urls), cpu_snapshot(dep.pids())
            handled1 = await replica_requests(session, dep.replica_metrics_urls)
            row = summarize(dep.policy, cell, records, stats0, stats1, cpu0, cpu1)
            row["replica_requests"] = [b - a for a, b in zip(handled0, handled1, strict=True)]
            count = warm.account(visits(cell, records))
            row |= {
                "warm_requests": count.warm,
                "warm_misses": count.misses,
                "warm_miss_rate": count.miss_rate,
            }
            row["requests"] = raw_records(records)
            rows.append(row)
            print(
                f"    {cell.rate:6.1f} req/s -> {row['throughput_rps']:6.1f} ok/s, "
                f"TTFT p50 {row['ttft_p50_ms']:7.1f} p90 {row['ttft_p90_ms']:7.1f} ms, "
                f"hit {row['prefix_hit_rate']:.0%}, warm miss {percent(count.miss_rate)} "
                f"({count.misses}/{count.warm}), load max/mean {row['load_max_mean']:.2f}, "
                f"errors {row['errors']}, CPU {row['cpu']['machine']:.0f}% "
                f"(benchmark {row['cpu']['benchmark']:.0f}%)",
                flush=True,
            )
    return rows


def visits(cell: Cell, records: list[Record]) -> list[Visit]:
    """The warm-miss view of a cell's requests (bench.warmth)."""
    return [
        Visit(
            due=r.due,
            first_token=None if r.ttft_s is None else r.due + r.ttft_s,
            warm_prefixes=p.warm_prefixes,
            marks=p.marks,
            cached_tokens=r.cached_tokens,
        )
        for p, r in zip(cell.requests, records, strict=True)
    ]


async def calibrate(dep: Deployment, cell: Cell, mean_output_tokens: float) -> float:
    """Round robin's capacity: requests/s it completes under overload, once queues are full.

    Counted in output tokens (of the requests completed in the last two thirds of the
    run) divided by the workload's mean output length: a plain completion count over a
    few seconds swings by several % with the mix of long and short outputs.
    """
    async with client_session() as session:
        records = await run_cell(session, dep.url, cell, drain_timeout=0.0)
    t0, t1 = cell.duration / 3, cell.duration
    tokens = sum(
        p.max_tokens
        for p, r in zip(cell.requests, records, strict=True)
        if r.error is None and r.e2e_s is not None and t0 <= p.offset_s + r.e2e_s < t1
    )
    return tokens / (t1 - t0) / mean_output_tokens


def raw_records(records: list[Record]) -> dict[str, list[Any]]:
    """Per-request results, column-wise (ms rounded to 0.1; null where not reached)."""

    def ms(v: float | None) -> float | None:
        return None if v is None else round(v * 1000, 1)

    return {
        "group": [r.group for r in records],
        "server": [r.server for r in records],
        "ttft_ms": [ms(r.ttft_s) for r in records],
        "e2e_ms": [ms(r.e2e_s) for r in records],
        "lag_ms": [ms(r.lag_s) for r in records],
        "cached_tokens": [r.cached_tokens for r in records],
        "error": [r.error for r in records],
    }


# ---------------------------------------------------------------- statistics


def departure_rate(cell: Cell, records: list[Record], t0: float, t1: float) -> float:
    """Successful completions per second between ``t0`` and ``t1`` (seconds after start)."""
    done = sum(
        1
        for p, r in zip(cell.requests, records, strict=True)
        if r.error is None and r.e2e_s is not None and t0 <= p.offset_s + r.e2e_s < t1
    )
    return done / (t1 - t0)


def pct(sorted_values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile of an ascending list (NaN if empty)."""
    if not sorted_values:
        return math.nan
    return sorted_values[min(len(sorted_values) - 1, max(0, math.ceil(p * len(sorted_values)) - 1))]


def summarize(
    policy: Policy,
    cell: Cell,
    records: list[Record],
    stats0: list[dict[str, Any]],
    stats1: list[dict[str, Any]],
    cpu0: dict[str, float],
    cpu1: dict[str, float],
) -> dict[str, Any]:
    ok = [r for r in records if r.error is None]
    ttft = sorted(r.ttft_s * 1000 for r in ok if r.ttft_s is not None)
    e2e = sorted(r.e2e_s * 1000 for r in ok if r.e2e_s is not None)
    lag = sorted(r.lag_s * 1000 for r in records)
    errors: dict[str, int] = {}
    for r in records:
        if r.error is not None:
            errors[r.error] = errors.get(r.error, 0) + 1
    names = [s["instance"] for s in stats1]
    per_server = {name: 0 for name in names}
    for r in records:
        if r.server:
            per_server[r.server] = per_server.get(r.server, 0) + 1
    mean_load = sum(per_server.values()) / max(len(per_server), 1)
    queries = sum(
        b["prefix_cache_queries_tokens"] - a["prefix_cache_queries_tokens"]
        for a, b in zip(stats0, stats1, strict=True)
    )
    hits = sum(
        b["prefix_cache_hits_tokens"] - a["prefix_cache_hits_tokens"]
        for a, b in zip(stats0, stats1, strict=True)
    )
    groups: dict[int, set[str]] = {}
    for r in records:
        if r.server:
            groups.setdefault(r.group, set()).add(r.server)
    # CPU in % of one core (the machine has os.cpu_count() x 100 %).
    wall = cpu1["_wall"] - cpu0["_wall"]
    cpu = {
        name: round((cpu1[name] - cpu0[name]) / wall * 100, 1)
        for name in cpu1
        if not name.startswith("_")
    }
    cpu["benchmark"] = round(sum(cpu.values()), 1)
    total = cpu1["_total"] - cpu0["_total"]
    busy = (cpu1["_busy"] - cpu0["_busy"]) / total if total else 0.0
    cpu["machine"] = round(busy * (os.cpu_count() or 1) * 100, 1)
    cpu["other"] = round(max(0.0, cpu["machine"] - cpu["benchmark"]), 1)
    return {
        "policy": policy.name,
        "rate": cell.rate,
        "duration_s": cell.duration,
        "sent": len(records),
        "ok": len(ok),
        "errors": sum(errors.values()),
        "error_kinds": errors,
        # Completion rate once the first quarter (queues filling) is over: the arrival
        # rate below capacity, the capacity above it.
        "throughput_rps": departure_rate(cell, records, cell.duration / 4, cell.duration),
        "ttft_p50_ms": pct(ttft, 0.5),
        "ttft_p90_ms": pct(ttft, 0.9),
        "ttft_p99_ms": pct(ttft, 0.99),
        "e2e_p50_ms": pct(e2e, 0.5),
        "e2e_p90_ms": pct(e2e, 0.9),
        "per_server": per_server,
        "load_max_mean": max(per_server.values()) / mean_load if mean_load else math.nan,
        "prefix_hit_rate": hits / queries if queries else math.nan,
        "servers_per_group": sum(len(s) for s in groups.values()) / max(len(groups), 1),
        "client_lag_p99_ms": pct(lag, 0.99),
        "client_lag_max_ms": lag[-1] if lag else math.nan,
        "cpu": cpu,
        "wall_s": wall,
    }


# ---------------------------------------------------------------- main


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.routing",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = p.add_argument
    add(
        "--policy",
        dest="policies",
        action="append",
        type=parse_policy,
        metavar="SPEC",
        help="round-robin | least-request | ideal | ideal-split | NAME=EPP_SERVE_ARGS "
        "(repeatable; default: " + ", ".join(DEFAULT_POLICIES) + ")",
    )
    add(
        "--quick",
        action="store_true",
        help="smoke run: --duration 4 --warmup 2 --calibrate 6 --loads 0.5 0.8 1.1 unless given",
    )
    add("--servers", type=argtypes.positive_int, default=4, help="simulated model servers")
    add(
        "--duration",
        type=argtypes.non_negative_float,
        default=None,
        help="seconds of arrivals per rate (default 15)",
    )
    add(
        "--warmup",
        type=argtypes.non_negative_float,
        default=None,
        help="unmeasured seconds at the lowest rate after each policy starts (default 5)",
    )
    add(
        "--drain-timeout",
        type=argtypes.non_negative_float,
        default=30.0,
        help="seconds to wait for outstanding requests after the arrivals end",
    )
    add(
        "--loads",
        type=float,
        nargs="+",
        default=None,
        help="rates as fractions of the calibrated round-robin capacity "
        "(default 0.4 0.6 0.8 1.0 1.2)",
    )
    add(
        "--rates",
        type=float,
        nargs="+",
        default=None,
        help="absolute rates in req/s (no calibration)",
    )
    add(
        "--calibrate",
        type=argtypes.non_negative_float,
        default=None,
        help="seconds of round-robin overload measuring the capacity --loads refer to "
        "(default 10, --quick 6; 0 = use the model estimate)",
    )
    add("--seed", type=int, default=1, help="seed of arrivals, groups and lengths")
    w = p.add_argument_group("workload")
    w.add_argument(
        "--workload",
        choices=KINDS,
        default="groups",
        help="groups: shared system prompts per group; control: every prompt unique (no "
        "prefix to reuse); multi-turn: chat sessions that resend their history",
    )
    w.add_argument("--groups", type=argtypes.positive_int, default=16)
    w.add_argument(
        "--prefix-tokens",
        type=argtypes.positive_int,
        default=1500,
        help="system prompt length per group",
    )
    for flag, default, what in (
        ("--question-tokens", [20, 200], "user question length"),
        ("--output-tokens", [10, 100], "max_tokens of each request"),
        ("--turns", [2, 6], "multi-turn: turns per session"),
    ):
        w.add_argument(
            flag, type=argtypes.positive_int, nargs=2, default=default, metavar=("MIN", "MAX"),
            help=f"{what} (inclusive range, drawn uniformly)",
        )  # fmt: skip
    w.add_argument(
        "--skew",
        type=argtypes.non_negative_float,
        default=0.0,
        help="Zipf exponent of the group popularity (0 = uniform)",
    )
    w.add_argument(
        "--think-s", type=argtypes.positive_float, default=3.0,
        help="multi-turn: mean seconds from one turn's arrival to the next (exponential)",
    )  # fmt: skip
    s = p.add_argument_group("simulators")
    s.add_argument("--max-num-seqs", type=argtypes.positive_int, default=8)
    s.add_argument(
        "--kv-blocks",
        type=argtypes.positive_int,
        default=None,
        help="default: derived from the workload, see above",
    )
    s.add_argument(
        "--prefix-copies",
        type=argtypes.positive_float,
        default=1.25,
        help="size the derived --kv-blocks so that the pool's free KV under full load holds "
        "this many copies of every group's prefix (default 1.25: the stress setting; "
        "2: each group can have two homes)",
    )
    s.add_argument("--block-size", type=argtypes.positive_int, default=16)
    s.add_argument("--prefill-overhead-ms", type=argtypes.non_negative_float, default=5.0)
    s.add_argument("--prefill-ms-per-token", type=argtypes.non_negative_float, default=0.1)
    s.add_argument("--decode-ms-per-token", type=argtypes.non_negative_float, default=8.0)
    s.add_argument("--itl-ms-per-running-seq", type=argtypes.non_negative_float, default=0.5)
    add(
        "--processing",
        choices=PROCESSING_MODES,
        default="full",
        help="what Envoy shows the EPP (as epp stack --processing)",
    )
    add(
        "--kv-events",
        action="store_true",
        help="every policy's simulators publish KV events (epp stack --kv-events), for "
        "policies with a precise-prefix-cache-scorer, e.g. --policy "
        '"precise=--config configs/precise-prefix.yaml". The simulators then count one '
        "token per byte, so their block size and prefill cost per token are scaled by "
        f"{CHARS_PER_TOKEN}: the same blocks and timings as without",
    )
    add(
        "--per-request",
        action="store_true",
        help="also write every request's result to NAME_requests.json (~250 KB)",
    )
    add("--out", type=Path, default=RESULTS, help="where routing.{md,json,png} go")
    add(
        "--name",
        default=None,
        help="file name stem of the outputs (default: routing, with --quick routing-quick)",
    )
    return p


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    try:
        import uvloop

        factory = uvloop.new_event_loop
    except ImportError:
        factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(coro)


@dataclass(frozen=True)
class Workload:
    """What every cell draws from: the kind, its spec and prompts, and each oracle's
    group-to-server assignment (None: round robin by request)."""

    kind: Kind
    spec: WorkloadSpec
    prompts: list[str]
    assignments: dict[str, Assignment | None]
    servers: int
    extra_body: dict[str, Any] = field(default_factory=dict)  # merged into every body

    def cell(self, rate: float, duration: float, seed: int) -> Cell:
        cell = Cell(rate, duration)
        requests = generate(self.spec, rate, duration, seed, self.prompts, self.kind)
        for i, r in enumerate(requests):
            session = dict(r.headers).get(SESSION_HEADER, "")
            targets = {
                name: destination(i, r.group, assignment, self.servers, session)
                for name, assignment in self.assignments.items()
            }
            cell.requests.append(
                Planned(
                    r.offset_s,
                    orjson.dumps(r.body | self.extra_body),
                    r.group,
                    r.body["max_tokens"],
                    dict(r.headers),
                    r.warm_prefixes,
                    r.marks,
                    targets,
                )
            )
        return cell


def running_blocks(spec: WorkloadSpec, max_num_seqs: int, block_size: int) -> int:
    """KV blocks a server's running sequences hold when every slot is busy (a mean
    groups request: system prompt, question and answer)."""
    request_tokens = spec.prefix_tokens + mean_range(spec.question_tokens)
    request_tokens += mean_range(spec.output_tokens)
    return max_num_seqs * math.ceil(request_tokens / block_size)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    quick = args.quick
    duration = args.duration if args.duration is not None else (4.0 if quick else 15.0)
    warmup_s = args.warmup if args.warmup is not None else (2.0 if quick else 5.0)
    loads = args.loads or ([0.5, 0.8, 1.1] if quick else [0.4, 0.6, 0.8, 1.0, 1.2])
    policies: list[Policy] = args.policies or [parse_policy(p) for p in DEFAULT_POLICIES]
    if len({p.name for p in policies}) != len(policies):
        print("routing: policy names must be distinct", file=sys.stderr)
        return 2
    spec = WorkloadSpec(
        groups=args.groups,
        prefix_tokens=args.prefix_tokens,
        question_tokens=(args.question_tokens[0], args.question_tokens[1]),
        output_tokens=(args.output_tokens[0], args.output_tokens[1]),
        skew=args.skew,
        turns=(args.turns[0], args.turns[1]),
        think_s=args.think_s,
    )
    kv_blocks = args.kv_blocks or derived_kv_blocks(
        spec, args.servers, args.max_num_seqs, args.block_size, args.prefix_copies
    )
    sim = SimSettings(
        max_num_seqs=args.max_num_seqs,
        kv_blocks=kv_blocks,
        block_size=args.block_size,
        prefill_overhead_ms=args.prefill_overhead_ms,
        prefill_ms_per_token=args.prefill_ms_per_token,
        decode_ms_per_token=args.decode_ms_per_token,
        itl_ms_per_running_seq=args.itl_ms_per_running_seq,
    )
    estimate = estimated_capacity(spec, args.servers, sim)
    chars_per_token = CHARS_PER_TOKEN
    if args.kv_events:  # the simulators' byte tokenizer: the same blocks and prefill cost
        chars_per_token = 1
        sim = replace(
            sim,
            block_size=sim.block_size * CHARS_PER_TOKEN,
            prefill_ms_per_token=sim.prefill_ms_per_token / CHARS_PER_TOKEN,
        )
    prefix_blocks = math.ceil(args.prefix_tokens / args.block_size)
    all_prefixes = args.groups * prefix_blocks
    free = kv_blocks - running_blocks(spec, args.max_num_seqs, args.block_size)
    per_server = groups_per_server(free, prefix_blocks)
    weights = group_weights(spec.groups, spec.skew)
    assignments = {
        name: assign_groups(weights, args.servers, per_server, split=name == "ideal-split")
        for name in ORACLES
    }
    workload = Workload(
        args.workload,
        spec,
        system_prompts(spec),
        {n: None if args.workload == "control" else a for n, a in assignments.items()},
        args.servers,
    )
    print(
        f"routing: {len(policies)} policies; kv-blocks {kv_blocks} (all {args.groups} "
        f"prefixes: {all_prefixes}); round-robin capacity from the model {estimate:.1f} req/s",
        flush=True,
    )
    workdir = scratch_dir("epp-routing-")
    began = time.monotonic()
    calibrated: float | None = None
    calibrate_s = args.calibrate if args.calibrate is not None else (6.0 if quick else 10.0)
    if args.rates:
        rates = sorted(args.rates)
    else:
        if calibrate_s > 0:
            cell = workload.cell(1.5 * estimate, calibrate_s, args.seed + 2000)
            rr = Policy("calibration", None)
            with Deployment(
                rr,
                workdir / "calibration",
                args.servers,
                sim,
                args.processing,
                spec.model,
                args.kv_events,
            ) as dep:
                calibrated = run_async(calibrate(dep, cell, mean_range(spec.output_tokens)))
            print(
                f"  calibration: round robin at {cell.rate:.1f} req/s for {calibrate_s:g} s "
                f"completed {calibrated:.1f} req/s",
                flush=True,
            )
        base = calibrated or estimate
        rates = sorted(round(load * base, 1) for load in loads)
    cells = [workload.cell(r, duration, args.seed + i) for i, r in enumerate(rates)]
    warmup = workload.cell(rates[0], warmup_s, args.seed + 1000) if warmup_s else None
    print(f"  rates {rates} req/s, {duration:g} s each", flush=True)
    rows: list[dict[str, Any]] = []
    for policy in policies:
        print(f"  {policy.name}: {policy.describe()}", flush=True)
        safe = re.sub(r"[^A-Za-z0-9_.-]", "-", policy.name)
        with Deployment(
            policy, workdir / safe, args.servers, sim, args.processing, spec.model, args.kv_events
        ) as dep:
            warm = WarmTracker(sim.block_size, chars_per_token)
            rows += run_async(drive(dep, warmup, cells, args.drain_timeout, warm))
    elapsed = time.monotonic() - began
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "machine": machine_description(),
        "git": git_state(),
        "command": ".venv/bin/python -m bench.routing"
        + "".join(f" {shlex.quote(a)}" for a in (sys.argv[1:] if argv is None else argv)),
        "elapsed_s": round(elapsed, 1),
        "workdir": str(workdir),
        "policies": {
            p.name: {"epp_args": p.epp_args, "replicas": p.replicas, "describe": p.describe()}
            for p in policies
        },
        "servers": args.servers,
        "sim": sim.__dict__,
        "sim_argv": sim.argv(),
        "workload": {**spec.__dict__, "seed": args.seed, "kind": args.workload},
        "oracle": {
            "groups_per_server": per_server,
            **{
                name: {
                    "assignment": workload.assignments[name],
                    "server_loads": [round(x, 4) for x in server_loads(weights, a, args.servers)],
                }
                for name, a in assignments.items()
            },
        },
        "duration_s": duration,
        "warmup_s": warmup_s,
        "drain_timeout_s": args.drain_timeout,
        "processing": args.processing,
        "kv_events": args.kv_events,
        "estimated_capacity_rps": round(estimate, 2),
        "calibrated_capacity_rps": None if calibrated is None else round(calibrated, 2),
        "calibrate_s": calibrate_s if calibrated is not None else 0,
        "loads": None if args.rates else loads,
        "all_prefix_blocks": all_prefixes,
        "rates": rates,
    }
    name = args.name or ("routing-quick" if quick else "routing")
    write_results(args.out, name, meta, rows, args.per_request)
    print(f"done in {elapsed:.0f} s; logs in {workdir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
