"""Routing on real vLLM servers (``make bench-vllm``): bench.routing's workload and load
generator against vLLM's CPU build instead of the simulator, scored by vLLM's own
prefix-cache counters.

Run: ``.venv/bin/python -m bench.vllm_routing`` (needs ``.venv-vllm`` and the tiny model,
as ``make test-vllm`` builds them; docs/test-vllm.md). Writes bench/results/NAME.{md,json}
(default name ``vllm-routing``).

What runs. ``--servers`` vLLM servers (tests/vllm/servers.py: the tiny random Llama,
prefix caching on, KV events published) start once, with ``--kv-blocks`` KV blocks each
(``--num-gpu-blocks-override``: small, so the groups' prefixes compete for KV). Then, per
policy, every server's prefix cache is reset and the policy's front starts: Envoy alone
round robin, Envoy + ``epp serve`` with the servers as ``--endpoint`` flags (the default
config), and Envoy + ``epp serve --config configs/precise-prefix.yaml`` with the servers
listed as config endpoints labelled with their KV-event publishers and the model's
tokenizer (epp_harness.stack.kv_events_config, as the simulator runs wire it). Each
policy gets ``--warmup`` s of unmeasured load at the lowest rate, then every rate for
``--duration`` s (bench.routing.drive; the same seeded requests for every policy).

Sizes are in the tiny model's tokens: bench.workload writes text at 4 characters per
simulator token, and the tiny model's byte-level BPE takes about 1.2 characters per token
of that text, so the spec's token counts are scaled by the measured ratio (tokenizing the
system prompts with the model's own tokenizer) and the report gives the real lengths.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shlex
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from bench.host import git_state, machine_description
from bench.oracle import assign_groups
from bench.routing import Policy, Workload, drive, run_async
from bench.vllm_routing_report import (
    counters,
    deltas,
    kv_index_view,
    report_row,
    write_results,
)
from bench.warmth import WarmTracker
from bench.workload import CHARS_PER_TOKEN, WorkloadSpec, group_weights, system_prompts
from epp.common.tokenization import HfTokenizer
from epp_harness.envoyconfig import EnvoyOptions, baseline_config, client_routed_config
from epp_harness.envoyproc import EnvoyProcess, write_config
from epp_harness.procs import scratch_dir
from epp_harness.stack import LocalStack, StackOptions, kv_events_config
from tests.vllm.servers import MODEL_NAME, VllmServer, model_dir, vllm_python, vllm_servers

RESULTS = Path(__file__).resolve().parent / "results"
REPO = Path(__file__).resolve().parents[1]
PRECISE = REPO / "configs" / "precise-prefix.yaml"
BLOCK_SIZE = 128  # vLLM's CPU build's block size for the tiny model
POLICIES = ("round-robin", "default", "precise-prefix", "ideal")


def spec_tokens(model_tokens: int, chars_per_model_token: float) -> int:
    """bench.workload's token count (``CHARS_PER_TOKEN`` characters each) for text that
    is ``model_tokens`` tokens of a tokenizer taking ``chars_per_model_token``."""
    return max(1, round(model_tokens * chars_per_model_token / CHARS_PER_TOKEN))


def chars_per_model_token(prompts: Sequence[str], tokenizer: HfTokenizer) -> float:
    chars = sum(len(p) for p in prompts)
    ids = [tokenizer.encode(p, add_special_tokens=False) or [] for p in prompts]
    return chars / max(1, sum(len(i) for i in ids))


@dataclass
class VllmFront:
    """One policy's front (Envoy, and the EPP unless round robin) over the shared
    servers: what bench.routing.drive sends to."""

    policy: Policy
    servers: list[VllmServer]
    envoy: EnvoyProcess
    stack: LocalStack | None = None
    sim_addresses: list[str] = field(default_factory=list)
    sim_urls: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.sim_addresses = [s.address for s in self.servers]
        self.sim_urls = [s.url for s in self.servers]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.envoy.port}/v1/chat/completions"

    @property
    def replica_metrics_urls(self) -> list[str]:
        if self.stack is None:
            return []
        return [f"http://127.0.0.1:{http}/metrics" for _, http in self.stack.epp_ports]

    def pids(self) -> dict[str, list[int]]:
        pids = {
            "vllm": [s.proc.pid for s in self.servers],
            "envoy": [self.envoy.process.pid],
            "loadgen": [os.getpid()],
        }
        if self.stack is not None and self.stack.epp is not None:
            pids["epp"] = [self.stack.epp.pid]
        return pids


def epp_args(policy: str, servers: Sequence[VllmServer], workdir: Path) -> list[str]:
    endpoints = [arg for s in servers for arg in ("--endpoint", s.address)]
    if policy == "default":
        return endpoints
    kv_ports = [s.kv_events_port for s in servers]
    return kv_events_config(["--config", str(PRECISE)], endpoints, kv_ports, model_dir(), workdir)


def describe(policy: str) -> str:
    if policy == "round-robin":
        return "Envoy alone, static ROUND_ROBIN cluster, no EPP"
    if policy == "ideal":
        return (
            "the reference: Envoy alone, ORIGINAL_DST cluster, no EPP; the load generator "
            "sends each group to one fixed server (bench/oracle.py: groups spread evenly, "
            "`x-gateway-destination-endpoint`)"
        )
    if policy == "default":
        return "Envoy + `epp serve --endpoint ADDR ...` (the built-in default config)"
    return (
        "Envoy + `epp serve --config configs/precise-prefix.yaml`, the servers as config "
        "endpoints labelled with their KV-event publishers, the tiny model's tokenizer"
    )


@contextmanager
def front(policy: str, servers: list[VllmServer], workdir: Path) -> Iterator[VllmFront]:
    workdir.mkdir(parents=True, exist_ok=True)
    envoy_alone = policy in ("round-robin", "ideal")
    name = Policy(
        policy, None if envoy_alone else (), oracle="ideal" if policy == "ideal" else None
    )
    if envoy_alone:
        cluster = "original-dst" if name.oracle else "eds"
        opts = EnvoyOptions(listen_port=0, admin_port=0, cluster=cluster)
        addresses = [("127.0.0.1", s.port) for s in servers]
        config = client_routed_config(opts) if name.oracle else baseline_config(opts, addresses)
        envoy = EnvoyProcess(write_config(config, workdir / "envoy.yaml"), workdir, concurrency=1)
        envoy.start()
        try:
            yield VllmFront(name, servers, envoy)
        finally:
            envoy.stop()
        return
    opts = StackOptions(
        servers=0,
        model=MODEL_NAME,
        envoy_port=0,
        envoy_admin_port=0,
        grpc_port=0,
        http_port=0,
        epp_args=epp_args(policy, servers, workdir),
        log_level="warning",
        workdir=workdir,
        envoy_concurrency=1,
    )
    with LocalStack(opts) as stack:
        assert stack.envoy is not None
        wait_scraped(stack, len(servers))
        yield VllmFront(name, servers, stack.envoy, stack)


def wait_scraped(stack: LocalStack, servers: int, timeout: float = 60.0) -> None:
    """Until the EPP has scraped every server once (its /status shows their load)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"{stack.epp_http_url}/status", timeout=5) as resp:
            doc = json.loads(resp.read())
        if len([m for m in doc["endpoints"] if "load" in m]) == servers:
            return
        time.sleep(0.5)
    raise RuntimeError(f"the EPP did not scrape all {servers} servers in {timeout:g} s")


def epp_kv_index(target: VllmFront) -> dict[str, float]:
    """The EPP's precise-index view now ({} without an EPP)."""
    if not target.replica_metrics_urls:
        return {}
    with urllib.request.urlopen(target.replica_metrics_urls[0], timeout=10) as resp:
        return kv_index_view(resp.read().decode())


def reset_caches(servers: Sequence[VllmServer]) -> None:
    for s in servers:
        req = urllib.request.Request(f"{s.url}/reset_prefix_cache", data=b"", method="POST")
        with urllib.request.urlopen(req, timeout=60) as resp:
            if resp.status != 200:
                raise RuntimeError(f"{s.name}: reset_prefix_cache answered {resp.status}")


class Recorder:
    """bench.routing.drive's ``stats``: each server's counters from its /metrics, every
    snapshot kept (drive takes one before and one after each rate)."""

    def __init__(self) -> None:
        self.snapshots: list[list[dict[str, Any]]] = []

    async def __call__(
        self, session: aiohttp.ClientSession, urls: list[str]
    ) -> list[dict[str, Any]]:
        async def one(url: str) -> dict[str, Any]:
            async with session.get(f"{url}/metrics") as resp:
                text = await resp.text()
            return {"instance": url.removeprefix("http://"), **counters(text)}

        snap = list(await asyncio.gather(*(one(u) for u in urls)))
        self.snapshots.append(snap)
        return snap


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.vllm_routing", description=__doc__)
    p.add_argument("--servers", type=int, default=4)
    p.add_argument("--kv-blocks", type=int, default=32, help="per server (one: the null block)")
    p.add_argument("--groups", type=int, default=8)
    p.add_argument("--prefix-tokens", type=int, default=1000, help="model tokens per prefix")
    p.add_argument("--question-tokens", type=int, nargs=2, default=[20, 60])
    p.add_argument("--output-tokens", type=int, nargs=2, default=[8, 16])
    p.add_argument("--rates", type=float, nargs="+", default=[4.0, 8.0])
    p.add_argument("--duration", type=float, default=60.0)
    p.add_argument("--warmup", type=float, default=10.0)
    p.add_argument("--drain-timeout", type=float, default=30.0)
    p.add_argument("--policies", nargs="+", choices=POLICIES, default=list(POLICIES))
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--name", default="vllm-routing")
    p.add_argument("--note", default="", help="a line at the top of the report")
    p.add_argument("--out", type=Path, default=RESULTS)
    return p


def workload(args: argparse.Namespace) -> tuple[Workload, dict[str, Any]]:
    """The groups workload in the model's tokens, and what it measured of them."""
    tokenizer = HfTokenizer(model_dir())
    probe = WorkloadSpec(model=MODEL_NAME, groups=args.groups, prefix_tokens=args.prefix_tokens)
    ratio = chars_per_model_token(system_prompts(probe), tokenizer)
    spec = WorkloadSpec(
        model=MODEL_NAME,
        groups=args.groups,
        prefix_tokens=spec_tokens(args.prefix_tokens, ratio),
        question_tokens=(
            spec_tokens(args.question_tokens[0], ratio),
            spec_tokens(args.question_tokens[1], ratio),
        ),
        output_tokens=(args.output_tokens[0], args.output_tokens[1]),
        skew=0.0,
    )
    prompts = system_prompts(spec)
    prefix = round(sum(len(tokenizer.encode(p, False) or []) for p in prompts) / len(prompts))
    measured = {
        "chars_per_model_token": round(ratio, 3),
        "prefix_model_tokens": prefix,
        "prefix_blocks": prefix // BLOCK_SIZE,
        "all_prefix_blocks": args.groups * (prefix // BLOCK_SIZE),
        "question_model_tokens": args.question_tokens,
        "workload": {**spec.__dict__, "seed": args.seed},
    }
    # the oracle's homes: groups spread evenly, one server each (equal popularity)
    per_server = math.ceil(args.groups / args.servers)
    homes = assign_groups(group_weights(args.groups, 0.0), args.servers, per_server)
    wl = Workload("groups", spec, prompts, {"ideal": homes}, args.servers, {"ignore_eos": True})
    return wl, measured


def vllm_version() -> str:
    out = subprocess.run(
        [vllm_python(), "-c", "import vllm; print(vllm.__version__)"],
        capture_output=True,
        text=True,
        check=False,
    )
    return out.stdout.strip() or "?"


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not Path(vllm_python()).exists():
        print(
            f"bench-vllm: no vLLM venv at {vllm_python()}: install it as `make test-vllm` "
            "does (its .venv-vllm/.installed step; docs/test-vllm.md)",
            file=sys.stderr,
        )
        return 2
    wl, measured = workload(args)
    rates = sorted(args.rates)
    cells = [wl.cell(r, args.duration, args.seed + i) for i, r in enumerate(rates)]
    warmup = wl.cell(rates[0], args.warmup, args.seed + 1000) if args.warmup else None
    server_args = ["--num-gpu-blocks-override", str(args.kv_blocks), "--block-size", "128"]
    workdir = scratch_dir("epp-vllm-routing-")
    print(
        f"vllm-routing: {args.servers} servers x {args.kv_blocks} KV blocks; {args.groups} "
        f"prefixes of {measured['prefix_model_tokens']} tokens; rates {rates} req/s, "
        f"{args.duration:g} s each; logs in {workdir}",
        flush=True,
    )
    began = time.monotonic()
    rows: list[dict[str, Any]] = []
    kv_index: dict[str, dict[str, float]] = {}
    specs = [(f"vllm-{i}", server_args, {}) for i in range(args.servers)]
    with vllm_servers(workdir, specs) as servers:
        for policy in args.policies:
            print(f"  {policy}: {describe(policy)}", flush=True)
            reset_caches(servers)
            recorder = Recorder()
            with front(policy, servers, workdir / policy) as target:
                warm = WarmTracker(BLOCK_SIZE, measured["chars_per_model_token"])
                runs = run_async(
                    drive(target, warmup, cells, args.drain_timeout, warm, stats=recorder)
                )
                kv_index[policy] = epp_kv_index(target)
            pairs = zip(recorder.snapshots[::2], recorder.snapshots[1::2], strict=True)
            for row, (before, after) in zip(runs, pairs, strict=True):
                rows.append(report_row(row, deltas(before, after)))
                print(f"    vLLM prefix-cache hit rate {rows[-1]['vllm_hit_rate']:.1%}", flush=True)
    meta = {
        "title": args.name,
        "note": args.note,
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "machine": machine_description(),
        "git": git_state(),
        "command": ".venv/bin/python -m bench.vllm_routing"
        + "".join(f" {shlex.quote(a)}" for a in (sys.argv[1:] if argv is None else argv)),
        "elapsed_s": round(time.monotonic() - began, 1),
        "vllm_version": vllm_version(),
        "servers": args.servers,
        "kv_blocks": args.kv_blocks,
        "block_size": BLOCK_SIZE,
        "server_args": server_args,
        "policies": {p: describe(p) for p in args.policies},
        "rates": rates,
        "duration_s": args.duration,
        "warmup_s": args.warmup,
        "drain_timeout_s": args.drain_timeout,
        "epp_kv_index": kv_index,
        **measured,
    }
    write_results(args.out, args.name, meta, rows)
    print(f"wrote {args.out / args.name}.md", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
