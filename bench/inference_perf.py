"""inference-perf (kubernetes-sigs) as the benchmark client: its ``shared_prefix`` data
through Envoy round robin and through Envoy + the EPP, on the simulators.

Run: ``make bench-inference-perf`` (installs inference-perf in a venv of its own, with
Python >= 3.12: ``IPERF_PYTHON``), or, with that venv in place,
``.venv/bin/python -m bench.inference_perf [--rates 5 9] [--duration 60]``.
Writes bench/results/NAME.md (inference-perf's own numbers per policy and rate, side by
side) and NAME.json (those numbers, the run's settings and inference-perf's per-stage
reports as it wrote them).

What runs. For each policy (``--policy``, as bench.routing's: ``round-robin`` is Envoy
alone with a static round-robin cluster, ``NAME=ARGS`` Envoy + ``epp serve ARGS``; by
default round-robin and ``default=``, plain ``epp serve``), in turn: ``--servers`` fresh
simulators (bench.routing's Deployment, its simulator settings pinned the same way), then
one inference-perf run with one Poisson stage per rate, in increasing order (the caches
carry over from stage to stage). inference-perf is used as installed, unchanged: the
config it gets (``inference-perf.yaml`` in each policy's work directory) asks for its
``shared_prefix`` data (``--groups`` system prompts of ``--system-prompt-tokens``, each
with ``--prompts-per-group`` questions of ``--question-tokens``, ``--output-tokens``
out), streaming completions, ``--seed`` as its base seed. It builds those prompts from
random token ids of the tokenizer the simulators count with
(epp_harness.sim.chunk_tokenizer: every id is 4 characters, so its lengths are exact and
the simulators' ``usage`` agrees with them).

KV: as bench.routing sizes it, the running working set of ``--max-num-seqs`` requests
plus ``--prefix-copies`` (1.6) copies of one server's share of the system prompts, so
the pool's free KV holds 1.6 copies of every prefix and no server holds them all.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.host import git_state, machine_description
from bench.inference_perf_report import write_results
from bench.routing import Deployment, Policy, SimSettings, derived_kv_blocks, parse_policy
from bench.workload import WorkloadSpec
from epp.common import argtypes
from epp_harness.procs import scratch_dir
from epp_harness.sim import chunk_tokenizer

REPO = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).resolve().parent / "results"
IPERF = REPO / ".venv-iperf" / "bin" / "inference-perf"
DEFAULT_POLICIES = ["round-robin", "default="]


def iperf_config(
    args: argparse.Namespace, base_url: str, tokenizer: Path, reports: Path
) -> dict[str, Any]:
    """inference-perf's config (its YAML schema; JSON is YAML)."""
    return {
        "api": {"type": "completion", "streaming": True},
        "data": {
            "type": "shared_prefix",
            "shared_prefix": {
                "num_groups": args.groups,
                "num_prompts_per_group": args.prompts_per_group,
                "system_prompt_len": args.system_prompt_tokens,
                "question_len": args.question_tokens,
                "output_len": args.output_tokens,
            },
        },
        "load": {
            "type": "poisson",
            "stages": [{"rate": rate, "duration": args.duration} for rate in args.rates],
            "num_workers": args.workers,
            "base_seed": args.seed,
        },
        "server": {"type": "vllm", "model_name": "sim-model", "base_url": base_url},
        "tokenizer": {"pretrained_model_name_or_path": str(tokenizer)},
        "report": {"request_lifecycle": {"summary": True, "per_stage": True, "per_request": False}},
        "storage": {"local_storage": {"path": str(reports)}},
    }


def stage_reports(reports: Path, stages: int) -> list[dict[str, Any]]:
    """inference-perf's per-stage reports, in stage order (an empty dict where a stage
    wrote none)."""
    out: list[dict[str, Any]] = []
    for i in range(stages):
        found = sorted(reports.rglob(f"stage_{i}_lifecycle_metrics.json"))
        out.append(json.loads(found[0].read_text()) if found else {})
    return out


def run_policy(
    args: argparse.Namespace, policy: Policy, sim: SimSettings, workdir: Path
) -> list[dict[str, Any]]:
    """One policy: fresh simulators, one inference-perf run; its per-stage reports."""
    workdir.mkdir(parents=True, exist_ok=True)
    tokenizer = chunk_tokenizer.write_tokenizer_files(workdir / "tokenizer")
    reports = workdir / "reports"
    with Deployment(policy, workdir / "stack", args.servers, sim, "full", "sim-model") as dep:
        assert dep.envoy is not None
        config = iperf_config(args, f"http://127.0.0.1:{dep.envoy.port}", tokenizer, reports)
        path = workdir / "inference-perf.yaml"
        path.write_text(json.dumps(config, indent=1))
        log = workdir / "inference-perf.log"
        # prompt generation, the stages and their drain
        timeout = 300 + len(args.rates) * (args.duration + 120)
        with log.open("wb") as out:
            done = subprocess.run(
                [str(args.iperf), "-c", str(path)],
                cwd=workdir,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=timeout,
                check=False,
            )
        if done.returncode != 0:
            tail = log.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"inference-perf exited {done.returncode} ({log}):\n{tail}")
    return stage_reports(reports, len(args.rates))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.inference_perf",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = p.add_argument
    add("--policy", dest="policies", action="append", type=parse_policy, metavar="SPEC",
        help="round-robin or NAME=EPP SERVE ARGS (repeatable; default: "
        + ", ".join(DEFAULT_POLICIES) + ")")  # fmt: skip
    add("--rates", type=argtypes.positive_float, nargs="+", default=[5.0, 9.0],
        help="Poisson stages, req/s (default 5 9)")  # fmt: skip
    add("--duration", type=argtypes.positive_int, default=60, help="seconds per stage")
    add("--groups", type=argtypes.positive_int, default=16)
    add("--prompts-per-group", type=argtypes.positive_int, default=32)
    add("--system-prompt-tokens", type=argtypes.positive_int, default=1500)
    add("--question-tokens", type=argtypes.positive_int, default=150)
    add("--output-tokens", type=argtypes.positive_int, default=32)
    add("--workers", type=argtypes.positive_int, default=2,
        help="inference-perf's worker processes")  # fmt: skip
    add("--seed", type=int, default=1, help="inference-perf's base seed")
    add("--servers", type=argtypes.positive_int, default=4)
    add("--max-num-seqs", type=argtypes.positive_int, default=4)
    add("--prefix-copies", type=argtypes.positive_float, default=1.6)
    add("--block-size", type=argtypes.positive_int, default=16)
    add("--iperf", type=Path, default=IPERF, help=f"the inference-perf executable ({IPERF})")
    add("--out", type=Path, default=RESULTS)
    add("--name", default="inference-perf")
    add("--note", default="", help="a line the result files carry (e.g. what the run was)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.rates = sorted(args.rates)
    args.iperf = args.iperf.absolute()  # it runs in each policy's work directory
    if not args.iperf.exists():
        print(
            f"inference-perf: {args.iperf} is missing: make bench-inference-perf", file=sys.stderr
        )
        return 2
    policies: list[Policy] = args.policies or [parse_policy(p) for p in DEFAULT_POLICIES]
    if any(p.oracle for p in policies):
        print("inference-perf: the oracles need bench.routing's own client", file=sys.stderr)
        return 2
    spec = WorkloadSpec(
        groups=args.groups,
        prefix_tokens=args.system_prompt_tokens,
        question_tokens=(args.question_tokens, args.question_tokens),
        output_tokens=(args.output_tokens, args.output_tokens),
    )
    sim = SimSettings(
        max_num_seqs=args.max_num_seqs,
        kv_blocks=derived_kv_blocks(
            spec, args.servers, args.max_num_seqs, args.block_size, args.prefix_copies
        ),
        block_size=args.block_size,
        prefill_overhead_ms=5.0,
        prefill_ms_per_token=0.1,
        decode_ms_per_token=8.0,
        itl_ms_per_running_seq=0.5,
    )
    workdir = scratch_dir("epp-inference-perf-")
    began = time.monotonic()
    stages: dict[str, list[dict[str, Any]]] = {}
    for policy in policies:
        print(f"  {policy.name}: {policy.describe()}", flush=True)
        safe = re.sub(r"[^A-Za-z0-9_.-]", "-", policy.name)
        stages[policy.name] = run_policy(args, policy, sim, workdir / safe)
    elapsed = time.monotonic() - began
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "machine": machine_description(),
        "git": git_state(),
        "command": ".venv/bin/python -m bench.inference_perf"
        + "".join(f" {shlex.quote(a)}" for a in (sys.argv[1:] if argv is None else argv)),
        "client": iperf_version(args.iperf),
        "elapsed_s": round(elapsed, 1),
        "workdir": str(workdir),
        "policies": {p.name: {"epp_args": p.epp_args, "describe": p.describe()} for p in policies},
        "servers": args.servers,
        "sim": sim.__dict__,
        "sim_argv": sim.argv(),
        "prefix_copies": args.prefix_copies,
        "note": args.note,
        "rates": args.rates,
        "duration_s": args.duration,
        "config": iperf_config(args, "http://ENVOY", Path("TOKENIZER"), Path("REPORTS")),
    }
    write_results(args.out, args.name, meta, stages)
    print(f"done in {elapsed:.0f} s; logs in {workdir}")
    return 0


def iperf_version(iperf: Path) -> str:
    """``inference-perf X.Y.Z``, read from the venv's installed metadata."""
    python = iperf.parent / "python"
    code = "import importlib.metadata as m; print(m.version('inference-perf'))"
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=False)
    return f"inference-perf {done.stdout.strip() or 'unknown'}"


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
