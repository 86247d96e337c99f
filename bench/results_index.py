"""Writes ``bench/results/README.md``: the one page that quotes performance figures.

Every number on it is read from the result files the benchmarks committed next to it
(``*.json``; titles from the ``*.md``), so a new run changes the page by re-running
this script, which ``make bench`` does last: ``python -m bench.results_index``
(``--check``: exit 1 if the page is stale). Other docs link here instead of copying
numbers; ``tests/unit/docs/test_docs.py`` fails when the committed page is not what this
script writes.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from bench import (
    inference_perf_report,
    overhead_ab,
    overhead_report,
    pd_report,
    vllm_routing_report,
)
from bench.overhead_report import PICKER
from bench.workers import PREDICT_CORES, predicted_rps

RESULTS = Path(__file__).resolve().parent / "results"
INDEX = RESULTS / "README.md"

# Targets the benchmarks are read against: what routing has to buy (prefills saved on
# shared prompts) and what the EPP may cost (latency and CPU a user would not notice).
TARGET_ADDED_MS = 5.0  # added latency for 220 KB prompts at concurrency 20
# The EPP against the request path it had at BASE_COMMIT and against the minimal Python
# picker (bench/minimal_picker.py), both measured in `make bench-overhead`'s A/B run.
BASE_COMMIT = "d9354b2"
TARGET_CPU_VS_BASE = 0.5  # EPP CPU per request at concurrency 64
TARGET_CPU_VS_PICKER = 0.5
TARGET_ADDED_VS_PICKER = 0.6  # added p50 at concurrency 1
TARGET_CHUNK_US = 20.0  # EPP CPU per streamed response chunk
AB = "overhead-ab"  # the A/B run's file (1 KB prompts, concurrency 1 and 64)
STREAMED = "overhead-streamed"  # the streamed paths' file
TARGET_DECISION_P99_US = 1000.0  # one scheduling cycle at 1,000 endpoints
TARGET_P90_VS_RR = 1 / 3  # p90 TTFT vs round robin at 0.7 load, Zipf groups, 1.6 copies
TARGET_WARM_MISS = 0.10  # warm-miss rate at every load
TARGET_LORA_VS_RR = 0.5  # adapter loads per 100 requests and TTFT p90 vs round robin
# equal-popularity groups, 1.6 copies, at 0.4 and 0.7 of round robin's capacity
TARGET_HIT_VS_ORACLE = 0.9  # the servers' prefix-cache hit rate vs the `ideal` oracle's
TARGET_HIT = 0.80
TARGET_P50_VS_RR = 0.35
TARGET_SHARED_P90_VS_RR = 0.8
TARGET_PAST_CAPACITY_VS_RR = 1.1  # throughput at 1.2 of round robin's capacity
NONE = "\N{EN DASH}"  # an empty table cell
MATRIX = "routing-zipf-"  # the routing matrix and its companions
# the matrix's equal-popularity cells (inference-perf's shared_prefix shape and llm-d's guide)
SHARED = ("routing-equal-", "routing-guide-")
MODEL = "routing-model"  # bench.routing_model: a design tool's numbers, not the benchmark

# Result files whose routing numbers rest on the simulator's KV cache as it was before it
# cached block for block like vLLM's (6be4733, 2026-11-27: the old cache dropped a
# request's unique blocks and let a shared prefix go before the questions after it).
# Take a name out when its file is re-run; render() refuses a file here dated after.
BEFORE_VLLM_CACHE = frozenset(
    {
        "fairness",
        "kv-events",
        "lora",
        "pd-mixed",
        "pd-mixed-2p2d",
        "pd-mixed-stall",
        "pd-prefill-decode",
        "pd-short",
        "routing",
        "routing-bounded",
        "routing-kv-shrink",
        "routing-model-calibration",
        "routing-model-control-kv1.6",
        "routing-model-fairness",
        "routing-model-groups-kv1.6",
        "routing-model-groups-kv1.6-events",
        "routing-model-groups-kv1.6-flow",
        "routing-model-groups-kv2.5",
        "routing-model-multi-turn-kv1.6",
        "routing-roomy",
        "routing-tuning",
        "routing-tuning-2",
        "routing-zipf-baseline",
        "routing-zipf-groups-kv1.6-flow",
        "routing-zipf-groups-kv1.6-flow-control-on",
    }
)
VLLM_CACHE_DATE = "2026-11-27 10:05"


def before_vllm_cache_section() -> list[str]:
    """The files measured on the old simulator cache, named once at the top."""
    for name in sorted(BEFORE_VLLM_CACHE):
        date = str(load(name).get("meta", {}).get("date") or "")
        if date >= VLLM_CACHE_DATE:
            raise ValueError(f"{name} was re-run ({date}): take it out of BEFORE_VLLM_CACHE")
    return [
        "## Measured on the old simulator cache",
        "",
        "The simulator's KV cache follows vLLM's block pool since 2026-11-27 (checked "
        "block for block against vLLM by `make test-vllm`; docs/simulator.md). These "
        "files were measured before, on a cache that dropped a request's unique blocks "
        "and let a shared prefix go before the questions after it: their routing numbers "
        "are to be re-run on today's simulator, and until then read them as the old "
        "simulator's.",
        "",
        ", ".join(link(name) for name in sorted(BEFORE_VLLM_CACHE)) + ".",
    ]


# What a file's policy names meant when it ran, where that differs from today.
POLICY_NOTES = {
    "ddeff04": "At ddeff04, when this ran, `default` was the latency-model scheduler "
    "(today `configs/predicted-latency.yaml`) and `previous` the weighted scorers "
    "(today's built-in default).",
}

INTRO = """\
# Benchmark results

<!-- Generated by `python -m bench.results_index` from the files in this directory
(`make bench` runs it last); tests/unit/docs/test_docs.py keeps it current. -->

The one place the project's performance figures live: each section below is read from
the result files next to this page (`NAME.json`, written with `NAME.md` and plots by
the benchmark that ran), and links to them for everything else. Other documents link
here rather than copy numbers.

All runs are on one 2-core VM that Envoy, the EPP, the simulators and the load
generator share, often with other work on the machine (the files' CPU columns say how
much). The VM's speed drifts during the day (Envoy alone at concurrency 1 served 1,161
req/s in a morning run of 2026-11-23 and 713 req/s in the afternoon run the overhead
files hold), so compare rows within a file, and read absolute numbers as this machine's.

{benchmarks}
`make bench` runs them all (about 2.5 hours). The simulators' latency and cache flags
are passed explicitly, so a change of `epp sim` defaults cannot move a baseline.
"""


BENCHMARKS = [
    (
        "overhead",
        "Envoy alone (static round robin) and Envoy + EPP side by side against the same "
        "simulators: p50/p99 latency, req/s and CPU per request of the EPP, of Envoy and "
        "of the simulators + load generator, how busy the machine was and how many cores "
        "other work took, per processing mode, transport and event loop; the last path "
        "runs Envoy without the ext_proc graceful-close flag (every stream reset). With "
        "instant servers a closed loop saturates the cores and the added latency is "
        "queueing for CPU (throughput view); `--server-ms 0 200` (what `make bench` runs "
        "for 220 KB prompts) repeats every path against servers that take 200 ms per "
        "completion, with clients pausing a random 100 ms on average between requests "
        "(`bench.loadgen --think-ms`) so they do not reach the EPP in lockstep: then the "
        "added latency is the EPP path's own. Each file's *Reading* sets the latter "
        "against the 5 ms target and checks the former against latency = concurrency x "
        "CPU per request / free cores. `make bench-overhead` runs the A/B the targets "
        "read (about 25 minutes; docs/development.md): d9354b2's EPP, this tree's "
        "grpclib and native transports and the minimal Python picker "
        "(`bench/minimal_picker.py`), each cell repeated in turn, old then new, in "
        "`overhead-ab` (1 KB), `overhead-220kb` and `overhead-streamed` (64-chunk SSE "
        "responses against the same in one piece: EPP CPU per chunk); "
        "`make bench-overhead-paths` runs every processing mode, transport and event "
        "loop once (`overhead`).",
    ),
    (
        "decision",
        "one scheduling cycle in process with the default config at 10 / 100 / 1,000 "
        "endpoints and 1 KB / 220 KB prompts, numpy path and list path "
        "(`python -m bench.decision --config FILE --name NAME` for another config)",
    ),
    (
        "scrape",
        "the EPP scraping `/metrics` alone (no requests) for 8 to 512 endpoints, with the "
        "scrape budget off and at its default: scrapes/s, CPU, the oldest metrics' age",
    ),
    (
        "kv-events",
        "what the servers' KV events cost the EPP on one core (`kv-events.md`): KV-event "
        "index updates (blocks/s "
        "applied, and with msgpack decoding), lookups against 1,000 endpoints, "
        "tokenization per request, and a decision with the precise prefix scorer at "
        "1,000 endpoints",
    ),
    (
        "fairness",
        "two tenants against 4 simulated servers of 2 slots: A floods with closed-loop "
        "streams (3 x the slots), B sends Poisson at 20 % of capacity; B's TTFT p50/p90 "
        "alone, under the flood with flow control and without it, A's and the total "
        "throughput, side by side in one run (`bench/fairness.py`)",
    ),
    (
        "routing",
        "the routing matrix: whether routing saves prefills on shared prompts under KV "
        "pressure, against round robin and an oracle (about an hour; "
        "`routing-zipf-WORKLOAD-kvCOPIES.md`, each "
        "with `_ttft.png` and `_load.png`): 4 simulators running 4 sequences each, "
        "Poisson arrivals at 0.4, 0.7 and 0.95 of round robin's calibrated capacity and "
        "1.2 (past it), 20 s per rate, fresh simulators per policy. Workloads "
        "(`bench/workload.py`): `groups` (16 groups of 1,500-token system prompts, "
        "Zipf-skewed popularity s = 1.1, so the top group is a third of the traffic; "
        "75-225-token questions, 16-48 output tokens), `control` (every prompt unique: "
        "nothing to reuse, least request is the yardstick) and `multi-turn` (chat "
        "sessions resending their history, `x-session-id`). KV sizes "
        "(`--prefix-copies`): free KV under load for 1.6 copies of all group prefixes (6 "
        "groups per server: the stress setting) and 2.5. Policies: round robin (Envoy "
        "alone), least request, the EPP's configs, and `ideal-split`: no EPP, Envoy's "
        "`ORIGINAL_DST` cluster, and the load generator names each request's server from "
        "an oracle that gives every server a fixed, KV-sized share of the groups "
        "balanced by their Zipf weights, a group heavier than a fair share getting "
        "several homes (`bench/oracle.py`; the plain `ideal` oracle, one home per group, "
        "is in `routing-zipf-baseline`, where its top group's server queues first). Per "
        "cell: TTFT p50/p90/p99, throughput, requests per server, prefix-cache hit rate, "
        "the *warm-miss rate* (of the requests whose prefix an earlier request had "
        "already prefilled, the share whose `usage.prompt_tokens_details.cached_tokens` "
        "show they paid that prefill again; `bench/warmth.py`), CPU; each file's reading "
        "gives every p90 as a multiple of the oracle's and round robin's.",
    ),
    (
        "lora",
        "LoRA adapter churn (`bench/lora.py`): 8 adapters with Zipf popularity over 4 "
        "simulators with 2 adapter slots each (100 ms swap), Poisson arrivals; adapter "
        "loads per 100 requests (slot swaps + runtime loads) and TTFT of round robin, "
        "the EPP with adapters registered everywhere, and the EPP loading them on demand",
    ),
    (
        "pd",
        "when splitting prefill from decode pays (about 1.5 hours; `pd.md`, `--quick` "
        "writes `pd-short.md`, "
        "each with `_itl.png`, `_ttft.png` and `_goodput.png`): the same 4 simulators "
        "(step-level batching with chunked prefill, so a long prefill slows the decodes "
        "beside it) aggregated and split 1P:3D and 2P:2D under the `nixl` and `sidecar` "
        "coordinators, and the deciders `always`, `never`, `prefix-based` and `benefit` "
        "on 1P:3D; prefill-heavy, decode-heavy and mixed workloads of unique prompts, "
        "Poisson arrivals at fractions of the aggregated pool's estimated capacity up to "
        "past it. Per cell: TTFT, ITL and e2e p50/p90/p99, throughput, the share "
        "disaggregated, goodput (TTFT and the request's own p90 ITL within their SLOs).",
    ),
    (
        "inference-perf",
        "inference-perf (kubernetes-sigs), installed unchanged in a venv of its own, as "
        "the client (`bench/inference_perf.py`): its `shared_prefix` data (16 groups of "
        "1,500-token system prompts, 150-token questions, 32 output tokens, streaming) "
        "at Poisson 5 and 9 req/s, 60 s each, through Envoy round robin and Envoy + the "
        "EPP on 4 simulators (4 sequences each, free KV for 1.6 copies of all prefixes); "
        "its own numbers side by side: KV-cache hit %, TTFT mean/p50/p90, throughput, "
        "requests and errors. Needs Python >= 3.12 (`IPERF_PYTHON`); not part of "
        "`make bench`",
    ),
    (
        "vllm",
        "the routing policies on 4 real vLLM CPU servers (`bench/vllm_routing.py`, "
        "about 14 minutes; `vllm-routing.md`): the tiny model, 32 KV blocks of 128 tokens "
        "each, 8 equal-popularity groups of ~1,000-token system prompts, unique questions, "
        "8-16 output tokens, Poisson at 4 and 8 req/s, 60 s each; round robin, the "
        "default config, `configs/precise-prefix.yaml` (the servers' KV events) and "
        "`ideal` (the load generator sends each group to one fixed server). Per "
        "cell: vLLM's own prefix-cache hit rate (its counters' deltas summed over the "
        "servers), TTFT p50/p90, completed requests and errors. Needs `.venv-vllm` as "
        "`make test-vllm` installs it; not part of `make bench`",
    ),
]


# Figures measured once, outside the benchmarks' result files; kept here so that every
# figure the project quotes is on one page.
OTHER_MEASUREMENTS = [
    "Where the EPP's CPU goes, in shares (docs/architecture.md's *Where the time goes*; "
    "`python -m bench.profile_path`, [`profile-request-path.md`](profile-request-path.md), "
    "2026-11-27 on the loaded VM: shares only). `epp serve` under Envoy at concurrency 32, "
    "py-spy with C frames: native, a non-streamed 1 KB request: transport 18 %, protobuf "
    "11 %, event loop and sockets 9 %, the lifecycle 41 % (scheduling 17 %, state machine "
    "9 %, metrics 6 %, parsing 5 %, latency model 2 %, observers 2 %), background work "
    "(scrapes) 18 %; a streamed chunk (64-chunk responses): transport 27 %, protobuf 25 %, "
    "state machine 19 %, the rest of the lifecycle 17 %, event loop 6 %. grpclib: its "
    "HTTP/2 in Python 59 % of a request, 68 % of a chunk. In process (cProfile): "
    "scheduling 43 % of a non-streamed request, the state machine 40 % of a streamed one; "
    "through the native transport with no socket, the transport 29 % and 48 %.",
    "Overhead, a morning run of 2026-11-23 on the VM's faster spell (the git history of "
    "`overhead.md` and `overhead-220kb.md`): 1 KB at concurrency 1, +1.4 / +2.5 ms "
    "(p50 / p99) for `lean` and about 0.7-0.9k req/s per EPP core; 220 KB at "
    "concurrency 20 with 200 ms servers, +4.2 to +5.6 ms p50 and +7.6 to +15.8 ms p99.",
    "Decision cost: an earlier run on a slower spell of the VM had one cell at 1,016 µs p99.",
    "Routing: homes sized to a group's demand (tried, not kept) measured p90 87-169 ms "
    "against 37 ms at 40 % load.",
    "Elastic membership (`tests/e2e/test_elastic.py::"
    "test_killed_server_costs_no_client_error_and_comes_back`, `pytest -s`, 6 client "
    "threads, simulators at `--time-scale 0.2`): a server killed with SIGKILL under load "
    "was ejected 0.085 s after the kill, with 0 client errors in 278 requests across the "
    "kill, the ejection, the restart and the reinstatement (an earlier manual run: 239 "
    "requests, 0 errors, ejected after 0.086 s).",
    "Tracing (`python -m bench.tracing --requests 2000 --rounds 7`, 2026-11-24, code at "
    "e3aba3a, load average 1.8 from other work): one whole ext_proc exchange in process "
    "(scheduling over 8 endpoints) took 164.5 µs without `--tracing` and 346.2 µs with "
    "it (+182 µs: three spans, the W3C headers, and the SDK's batching thread; earlier "
    "runs +136 to +260 µs). Without the flag no OpenTelemetry module is loaded.",
    "Peer load sharing between EPP replicas (`python -m bench.peerload`: every endpoint "
    "with requests open, one entry changed since the last frame; the 2-core VM while other "
    "work shared it): 100 endpoints: a 3.4 KB frame, 13 µs to build and encode it, 19 µs "
    "to decode, merge and apply it; 1,000 endpoints: 35 KB, 0.13 ms and 0.32 ms. So at "
    "the ceiling of 200 frames per second a peer's frames cost a receiver at most 0.4 % of "
    "a core with 100 busy endpoints, 6.5 % with 1,000; publishing 0.3 % and 2.5 %.",
    "Worker processes (`epp serve --workers N`, docs/workers.md; the 2-core VM while other "
    "work shared it). Messages (`python -m bench.workers`): one endpoint's load report "
    "costs 6-10 µs to encode, decode and apply, about 2 % of a core per worker for 100 "
    "endpoints at the 50 ms scrape interval; a membership change costs per worker 380 "
    "bytes and 21 µs for 4 endpoints, 8.7 KB and 0.4 ms for 100, 88 KB and 6.5 ms for "
    "1,000. The parent, idle with 4 simulators: 51-54 ms of CPU a second (one plain "
    "process 47-53); with 2 workers at concurrency 64, 60-65 ms a second, 45-220 µs per "
    "request (75-95 µs at ~700 req/s). An idle worker: 79 wake-ups and 12-13 ms of CPU a "
    "second with 4 endpoints when each load report went on its own, 38 and 6-7 ms "
    "gathered per 20 ms; the success messages were 4 % of a loaded worker's py-spy "
    "samples before they were passed on once a second. Scrapes (`python -m "
    "bench.workers_check --workers 1 2`): 18.9 per endpoint per second with one worker, "
    "19.0 with two (the interval allows 20). Approximate prefix routing (the same "
    "command): 100 % of a group's requests on its most used server with one process, 66 % "
    "with two workers. A worker SIGKILLed under load (`tests/e2e/test_workers.py -s`): "
    "3-4 requests failed in three runs, the last 0.03 s after the kill; health checks "
    "marked it failed 0.5-0.8 s after, the parent had it back 2.3-3.2 s after.",
    "Deferred decode pick (`deferDecode`, docs/disaggregation.md): the extra run of the "
    "decode profile took 36 µs against 89 µs for the whole cycle (1 prefill + 3 decode "
    "endpoints, the shared 2-core machine).",
    "Profiles behind docs/architecture.md (*Where the time goes*; the 2-core VM). Scraping: "
    "a full vLLM `/metrics` page took ~15 ms to parse, the engine's own lines ~0.3 ms. A "
    "220 KB request (grpclib, `full`) took ~2.5-3 ms of EPP CPU: h2 ~20-25 µs per 16 KB "
    "DATA frame in and ~20 µs out, ~14 frames each way; the JSON parse ~0.25 ms; prompt "
    "hashing and the prefix-index lookup (256 blocks) ~0.13 ms; building the echo ~0.06 "
    "ms; h2's discarded trace `repr` had cost ~20 µs a frame, and dropping it ~15 % of "
    "the EPP's CPU (cProfile, 300 requests); Envoy sent ~21 DATA frames per request "
    "whatever frame size was advertised; the simulators and load generator took ~5 ms of "
    "CPU per 220 KB request. Fixes: the echo filled in place 128 -> 56 µs per 220 KB "
    "echo; the prefix index's set work 145 -> 39 µs; holders as a bitmask, a fresh 220 "
    "KB insert 305 -> 212 µs and a match against a prefix held by 100 of 1,000 endpoints "
    "5.1 -> 0.4 ms. Garbage collection (`gc.callbacks` in `epp serve` under Envoy, 3,000 "
    "unique 220 KB prompts at concurrency 20): 64-90 gen-1 passes of up to 11 ms and 4-7 "
    "gen-2 passes of 15-74 ms before; with graceful close, the bitmask and `gc.freeze()` "
    "of ~60,000 start-up objects, 5 gen-1 passes (one of 7 ms, the rest under 1 ms) and "
    "no gen-2 pass. A py-spy profile (grpcio, uvloop, concurrency 32, 1 KB, 655 samples): "
    "everything under `ExtProcServicer.Process` 7.5 % of the samples, the scheduler 0.4 "
    "%, the event loop's C core 52 %, grpc's poller thread 32 %.",
    "One vLLM CPU server alone, sizing `make bench-vllm`'s rates (its workload, the shared "
    "2 cores at load average ~5): 16 req/s at TTFT p50 19 ms / p90 29 ms, 32 req/s at p50 "
    "368 ms / p90 813 ms (queueing), so it saturates near 25-30 req/s.",
]


def load(name: str) -> Any:
    return json.loads((RESULTS / f"{name}.json").read_text())


def title(name: str) -> str:
    first = (RESULTS / f"{name}.md").read_text().splitlines()[0]
    return first.removeprefix("# ").strip()


def link(name: str) -> str:
    return f"[`{name}.md`]({name}.md)"


def names(prefix: str) -> list[str]:
    return sorted(p.stem for p in RESULTS.glob(f"{prefix}*.json"))


def table(header: Iterable[str], rows: Iterable[Iterable[str]], right_from: int = 1) -> list[str]:
    header = list(header)
    align = ["---" if i < right_from else "---:" for i in range(len(header))]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def when(meta: dict[str, Any]) -> str:
    code = f", code at {meta['git']}" if meta.get("git") else ""
    return f"measured {meta['date']} on {meta['machine']}{code}"


# -- overhead -------------------------------------------------------------------------


def cell_name(server_ms: float, concurrency: int, chunks: int = 0) -> str:
    servers = "instant servers" if server_ms == 0 else f"servers {server_ms:g} ms"
    what = f", {overhead_report.workload(chunks)}" if chunks else ""
    return f"concurrency {concurrency}, {servers}{what}"


def overhead_section() -> list[str]:
    lines = [
        "## Overhead: what the EPP adds",
        "",
        "Added latency = the path's p50 / p99 minus Envoy alone's in the same cell, in "
        "ms, and (in brackets) the EPP's CPU per request. With instant servers and high "
        "concurrency the added latency is queueing for the 2 cores (the files' *Reading* "
        "checks it against "
        "concurrency x CPU per request / free cores).",
    ]
    for name in names("overhead"):
        data = load(name)
        cells = overhead_report.cells(data["rows"])
        header = ["path"] + [cell_name(ms, c, ch) for ms, ch, c, _ in cells]
        rows = []
        for path in [r["path"] for r in cells[0][3][1:]]:
            row = [path]
            for _, _, _, cell in cells:
                base = cell[0]
                r = next(x for x in cell if x["path"] == path)
                row.append(
                    f"{r['p50_ms'] - base['p50_ms']:+.1f} / {r['p99_ms'] - base['p99_ms']:+.1f}"
                    f" ({r['epp_cpu_us_per_req']:.0f} µs)"
                )
            rows.append(row)
        prompt = "220 KB" if "220" in name else "1 KB"
        lines += ["", f"### {link(name)}: {prompt} prompts, {when(data['meta'])}", ""]
        lines += table(header, rows)
    return lines


# -- decision -------------------------------------------------------------------------


def decision_section() -> list[str]:
    lines = [
        "## Decision cost: one scheduling cycle",
        "",
        "µs per cycle, in process; *new snapshot* = one endpoint's metrics change before "
        "every cycle; *list path* = the same cell with numpy off.",
    ]
    for name in names("decision"):
        data = load(name)
        rows = [
            [
                f"{r['endpoints']:,}",
                f"{r['prompt_bytes'] / 1024:.0f} KB",
                "yes" if r["churn"] else "no",
                f"{r['p50_us']:.0f}",
                f"{r['p99_us']:.0f}",
                f"{r['list_path']['p50_us']:.0f}",
                f"{r['list_path']['p99_us']:.0f}",
            ]
            for r in data["rows"]
        ]
        header = ["endpoints", "prompt", "new snapshot", "p50", "p99", "list p50", "list p99"]
        lines += ["", f"### {link(name)}: {title(name)}", "", f"{when(data['meta'])}.", ""]
        lines += table(header, rows, right_from=0)
    return lines


# -- fairness -------------------------------------------------------------------------


def fairness_section() -> list[str]:
    lines = ["## Fairness under a flood (flow control)"]
    for name in names("fairness"):
        data = load(name)
        meta = data["meta"]
        rows = [
            [
                r["scenario"],
                f"{r['b_ttft_p50_ms']:.0f}",
                f"{r['b_ttft_p90_ms']:.0f}",
                f"{r['a_rps']:.1f}",
                f"{r['total_rps']:.1f}",
            ]
            for r in data["rows"]
        ]
        note = f" {meta['label']}." if meta.get("label") else ""
        verdict_line = (
            f"B's p90 bound {meta['b_p90_bound_ms']:.0f} ms: "
            f"{'met' if meta['b_p90_within_bound'] else 'missed'}; total throughput "
            f"{'not lower' if meta['total_not_lower'] else 'lower'} than without flow control."
        )
        header = ["scenario", "B TTFT p50 ms", "B TTFT p90 ms", "A rps", "total rps"]
        lines += ["", f"### {link(name)}: {title(name)}", "", f"{when(meta)}.{note}", ""]
        lines += [*table(header, rows), "", verdict_line]
    return lines


# -- scrape ---------------------------------------------------------------------------


def scrape_section() -> list[str]:
    rows = [
        [
            f"{r['endpoints']}",
            "none" if not r["budget"] else f"{r['budget']:.0f}/s",
            f"{r['interval_s']:.3f}",
            f"{r['scrapes_per_s']:.0f}",
            f"{r['epp_cores']:.2f}",
            NONE if not r["scrapes_per_s"] else f"{r['epp_us_per_scrape']:.0f}",
            NONE if r["max_age_s"] is None else f"{r['max_age_s']:.2f}",
        ]
        for r in load("scrape")
    ]
    header = ["endpoints", "budget", "interval s", "scrapes/s", "EPP cores", "µs/scrape"]
    return [
        "## Scrape cost",
        "",
        f"### {link('scrape')}: {title('scrape')}",
        "",
        *table([*header, "max metrics age s"], rows, right_from=0),
    ]


# -- routing --------------------------------------------------------------------------


def loads_by_rate(data: dict[str, Any]) -> dict[float, float]:
    rates = sorted({r["rate"] for r in data["rows"]})
    return dict(zip(rates, data["meta"]["loads"], strict=True))


def policies(data: dict[str, Any]) -> list[str]:
    return list(dict.fromkeys(r["policy"] for r in data["rows"]))


def row_at(data: dict[str, Any], policy: str, rate: float) -> dict[str, Any]:
    return next(r for r in data["rows"] if r["policy"] == policy and r["rate"] == rate)


def p90_table(data: dict[str, Any]) -> list[str]:
    """p90 TTFT per policy and load, in ms and as a multiple of round robin's (of the
    first policy's where round robin did not run)."""
    loads = loads_by_rate(data)
    listed = policies(data)
    base = "round-robin" if "round-robin" in listed else listed[0]
    rows = []
    for policy in listed:
        row = [policy]
        for rate in loads:
            r = row_at(data, policy, rate)
            rr = row_at(data, base, rate)["ttft_p90_ms"]
            warm = r.get("warm_miss_rate")
            miss = f", {warm:.0%} warm misses" if warm is not None else ""
            row.append(f"{r['ttft_p90_ms']:.0f} ({r['ttft_p90_ms'] / rr:.2f}x{miss})")
        top = row_at(data, policy, max(loads))
        rows.append([*row, f"{top['throughput_rps']:.1f}"])
    header = ["policy"] + [f"load {load:g}" for load in loads.values()]
    return table([*header, "req/s past capacity"], rows)


def routing_section() -> list[str]:
    lines = [
        "## Routing quality",
        "",
        "p90 TTFT in ms at each load (a multiple of round robin's capacity), its ratio to "
        "round robin's p90 at the same load, and (where measured) the warm-miss rate; "
        "the last column is the throughput at the highest rate.",
    ]
    for name in [*names(MATRIX), *(n for prefix in SHARED for n in names(prefix))]:
        data = load(name)
        meta = data["meta"]
        lines += ["", f"### {link(name)}: {title(name)}", "", f"{when(meta)}."]
        note = POLICY_NOTES.get(str(meta.get("git", "")))
        if note:
            lines += ["", note]
        if "round-robin" not in policies(data):
            lines += ["", f"(Ratios to {policies(data)[0]}: round robin did not run here.)"]
        lines += ["", *p90_table(data)]
    lines += [
        "",
        f"### {link('routing-zipf-seeds')}",
        "",
        f"{title('routing-zipf-seeds')}: written by hand from eight `bench.routing` runs "
        "(the commands are in the file).",
        "",
        "### Earlier routing runs",
        "",
        "Weighted scorers alone on uniform groups, 8 sequences per server (`routing`: "
        "1.25 copies of every prefix; `routing-roomy`: 2 copies); kept for the decisions "
        "they backed (the files say what each policy was).",
        "",
    ]
    earlier = [n for n in names("routing") if not n.startswith((MATRIX, MODEL, *SHARED))]
    rows = [[link(n), str(load(n)["meta"]["date"]), ", ".join(policies(load(n)))] for n in earlier]
    lines += table(["file", "measured", "policies"], rows, right_from=9)
    models = ", ".join(link(n) for n in names(MODEL))
    if models:
        lines += [
            "",
            "### Routing model (a design tool, not the benchmark)",
            "",
            f"{models}: `python -m bench.routing_model`, the real scheduler and simulator "
            "engine on a virtual clock, several seeds per cell (docs/routing-model.md). "
            "Its numbers compare designs with each other; the tables above are the "
            f"measurements. What was tried with it: {link(MODEL)}.",
        ]
    return lines


# -- targets --------------------------------------------------------------------------


def verdict(ok: bool) -> str:
    return "met" if ok else "**not met**"


def ours(cell: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A cell's EPP rows on this code: not Envoy alone, the other checkout of an A/B
    run, or the minimal picker."""
    return [
        r
        for r in cell
        if "epp_cpu_us_per_req" in r and r.get("side") != "old" and r.get("key") != PICKER
    ]


def ratio_verdict(ratio: float, target: float) -> str:
    return "met" if ratio <= target else f"**missed** by {ratio - target:.2f}x"


def no_run(target: str, name: str, make: str) -> list[str]:
    return [target, f"{name}.json", f"No run committed yet: `make {make}` writes it", NONE]


def cell_at(rows: list[dict[str, Any]], concurrency: int) -> list[dict[str, Any]] | None:
    """The one-token, instant-server cell at ``concurrency`` (Envoy alone first)."""
    for ms, chunks, c, cell in overhead_report.cells(rows):
        if (ms, chunks, c) == (0.0, 0, concurrency):
            return cell
    return None


def cpu_targets(cell: list[dict[str, Any]] | None) -> list[list[str]]:
    """EPP CPU per request at concurrency 64 against d9354b2's and the picker's."""
    vs_base = f"EPP CPU per request at concurrency 64 ≤ {TARGET_CPU_VS_BASE:g}x {BASE_COMMIT}'s"
    vs_picker = f"EPP CPU per request at concurrency 64 ≤ {TARGET_CPU_VS_PICKER:g}x the picker's"
    new = ours(cell or [])
    old = [r for r in cell or [] if r.get("side") == "old"]
    picker = [r for r in cell or [] if r.get("key") == PICKER]
    rows = []
    for target, against, limit in (
        (vs_base, old, TARGET_CPU_VS_BASE),
        (vs_picker, picker, TARGET_CPU_VS_PICKER),
    ):
        if not new or not against:
            rows.append(no_run(target, AB, "bench-overhead"))
            continue
        ref = against[0]["epp_cpu_us_per_req"]
        ratios = [(r["epp_cpu_us_per_req"] / ref, r) for r in new]
        best, row = min(ratios, key=lambda x: x[0])
        each = "; ".join(f"{r['path']} {x:.2f}x" for x, r in ratios)
        rows.append(
            [
                target,
                f"{AB}, best path: {row['path']} (against {against[0]['path']}, {ref:.0f} µs)",
                each,
                ratio_verdict(best, limit),
            ]
        )
    return rows


def latency_target(cell: list[dict[str, Any]] | None) -> list[str]:
    """Added p50 at concurrency 1 against the picker's."""
    target = f"added p50 at concurrency 1 ≤ {TARGET_ADDED_VS_PICKER:g}x the picker's"
    picker = [r for r in cell or [] if r.get("key") == PICKER]
    if not cell or not ours(cell) or not picker:
        return no_run(target, AB, "bench-overhead")
    base = cell[0]["p50_ms"]
    ref = picker[0]["p50_ms"] - base
    if ref <= 0:
        return [target, AB, f"the picker added {ref:+.2f} ms: nothing to compare with", NONE]
    added = [((r["p50_ms"] - base) / ref, r) for r in ours(cell)]
    best, row = min(added, key=lambda x: x[0])
    each = "; ".join(f"{r['path']} {r['p50_ms'] - base:+.2f} ms ({x:.2f}x)" for x, r in added)
    return [
        target,
        f"{AB}, best path: {row['path']} (picker {ref:+.2f} ms)",
        each,
        ratio_verdict(best, TARGET_ADDED_VS_PICKER),
    ]


def chunk_target(rows: list[dict[str, Any]] | None) -> list[str]:
    """EPP CPU per streamed response chunk (``rows``: the streamed run's; None: no run)
    at the run's highest concurrency, where the EPP is busy and CPU is what limits it
    (at concurrency 1 every chunk also pays for waking the process), judged on this
    code's best path."""
    target = f"EPP CPU per streamed response chunk ≤ {TARGET_CHUNK_US:g} µs"
    if rows is None:
        return no_run(target, STREAMED, "bench-overhead")
    pairs = overhead_report.chunk_pairs(rows)
    top = max((s["concurrency"] for _, s in pairs), default=0)
    found: dict[str, float] = {}
    mine: set[str] = set()
    for plain, streamed in pairs:
        per_chunk = overhead_ab.per_chunk_us(plain, streamed)
        if per_chunk is None or streamed["concurrency"] != top:
            continue
        found[streamed["path"]] = per_chunk
        if ours([streamed]):
            mine.add(streamed["path"])
    if not mine:
        return [target, STREAMED, "no path of this code streamed more messages", NONE]
    best = min(mine, key=found.__getitem__)
    each = "; ".join(f"{n} {v:.1f} µs" for n, v in found.items())
    missed = found[best] - TARGET_CHUNK_US
    return [
        target,
        f"{STREAMED}, concurrency {top}, best path: {best}",
        each,
        "met" if missed <= 0 else f"**missed** by {missed:.1f} µs",
    ]


def throughput_report(cell: list[dict[str, Any]] | None) -> list[str]:
    """Max req/s here (report only) and what the CPU per request predicts for more cores."""
    target = (
        "max req/s at concurrency 64 (report only: on 2 cores Envoy, the servers and the "
        "load generator bound it)"
    )
    if not cell or not ours(cell):
        return no_run(target, AB, "bench-overhead")
    shown = [cell[0], *[r for r in cell[1:] if r.get("side") != "old"]]
    parts = []
    for r in shown:
        if "epp_cpu_us_per_req" not in r:
            parts.append(f"{r['path']} {r['rps']:.0f}")
            continue
        # a worker per core, each as busy per request as this one process was
        predicted = ", ".join(
            f"{cores * 1e6 / r['epp_cpu_us_per_req']:.0f} / {predicted_rps(r, cores)[1]:.0f}"
            for cores in PREDICT_CORES
        )
        parts.append(f"{r['path']} {r['rps']:.0f} (predicted {predicted})")
    cores = " and ".join(str(c) for c in PREDICT_CORES)
    return [
        target,
        f"{AB}; predicted req/s on {cores} cores from the CPU per request: the EPP alone "
        "with a worker per core / everything of this run on those cores (bench/workers.py)",
        "; ".join(parts),
        "report only",
    ]


def overhead_targets() -> list[list[str]]:
    """The request path's targets, from the A/B and streamed runs of `make bench-overhead`."""
    if (RESULTS / f"{AB}.json").exists():
        rows = load(AB)["rows"]
        c64, c1 = cell_at(rows, 64), cell_at(rows, 1)
    else:
        c64 = c1 = None
    streamed = load(STREAMED)["rows"] if (RESULTS / f"{STREAMED}.json").exists() else None
    return [*cpu_targets(c64), latency_target(c1), chunk_target(streamed), throughput_report(c64)]


def shared_prefix_targets() -> list[list[str]]:
    """The default on equal-popularity groups at 1.6 copies (inference-perf's
    shared_prefix shape), against round robin and the `ideal` oracle at 0.4 and 0.7 of
    round robin's capacity, and past it. Each ratio row also gives the oracle's, which
    shows where a target is out of any router's reach."""
    name = f"{SHARED[0]}groups-kv1.6"
    if not (RESULTS / f"{name}.json").exists():
        return [no_run("equal-popularity groups, 1.6 copies", name, "bench-routing")]
    data = load(name)
    loads = loads_by_rate(data)
    below = [rate for rate, load_ in loads.items() if load_ in (0.4, 0.7)]
    past = max(loads)
    where = f"{name}: default (oracle: ideal)"

    def at(policy: str, rate: float, key: str) -> float:
        return float(row_at(data, policy, rate)[key])

    def worst_ratio(policy: str, key: str) -> tuple[float, str]:
        ratios = [at(policy, rate, key) / at("round-robin", rate, key) for rate in below]
        each = " / ".join(f"{x:.2f}x" for x in ratios)
        return max(ratios), each

    hits = [at("default", rate, "prefix_hit_rate") for rate in below]
    oracle_hits = [at("ideal", rate, "prefix_hit_rate") for rate in below]
    vs_oracle = [h / o for h, o in zip(hits, oracle_hits, strict=True)]
    hit_ok = min(hits) >= TARGET_HIT and min(vs_oracle) >= TARGET_HIT_VS_ORACLE
    rows = [
        [
            f"prefix-cache hit ≥ {TARGET_HIT_VS_ORACLE:g}x the oracle's and ≥ "
            f"{TARGET_HIT:.0%} at loads 0.4 and 0.7 (equal groups, 1.6 copies)",
            where,
            " / ".join(f"{h:.0%} ({x:.2f}x)" for h, x in zip(hits, vs_oracle, strict=True)),
            verdict(hit_ok),
        ]
    ]
    for key, label, target in (
        ("ttft_p50_ms", "p50", TARGET_P50_VS_RR),
        ("ttft_p90_ms", "p90", TARGET_SHARED_P90_VS_RR),
    ):
        worst, each = worst_ratio("default", key)
        _, oracle = worst_ratio("ideal", key)
        rows.append(
            [
                f"TTFT {label} ≤ {target:g}x round robin's at loads 0.4 and 0.7 "
                "(equal groups, 1.6 copies)",
                where,
                f"{each} (oracle {oracle})",
                ratio_verdict(worst, target),
            ]
        )
    ratio = at("default", past, "throughput_rps") / at("round-robin", past, "throughput_rps")
    oracle_ratio = at("ideal", past, "throughput_rps") / at("round-robin", past, "throughput_rps")
    rows.append(
        [
            f"throughput past capacity ≥ {TARGET_PAST_CAPACITY_VS_RR:g}x round robin's "
            f"(load {loads[past]:g}, equal groups, 1.6 copies)",
            where,
            f"{ratio:.2f}x (oracle {oracle_ratio:.2f}x)",
            "met"
            if ratio >= TARGET_PAST_CAPACITY_VS_RR
            else f"**missed** by {TARGET_PAST_CAPACITY_VS_RR - ratio:.2f}x",
        ]
    )
    return rows


def targets_section() -> list[str]:
    rows: list[list[str]] = overhead_targets()
    over = load("overhead-220kb")["rows"]
    for ms, _, c, cell in overhead_report.cells(over):
        if ms == 0:
            continue  # instant servers: queueing for CPU, not the path's own latency
        base = cell[0]
        added = [
            (r["p50_ms"] - base["p50_ms"], r["p99_ms"] - base["p99_ms"], r) for r in ours(cell)
        ]
        met = [a for a in added if a[0] <= TARGET_ADDED_MS and a[1] <= TARGET_ADDED_MS]
        p50, p99, best = min(added, key=lambda a: (a[0], a[1]))
        rows.append(
            [
                f"added ≤ {TARGET_ADDED_MS:g} ms at p50 and p99, 220 KB, {cell_name(ms, c)}",
                f"overhead-220kb, best path: {best['path']}",
                f"{p50:+.1f} / {p99:+.1f} ms; {len(met)} of {len(added)} paths within",
                "met"
                if met
                else f"**missed** by {max(p50 - TARGET_ADDED_MS, 0):.1f} / "
                f"{max(p99 - TARGET_ADDED_MS, 0):.1f} ms",
            ]
        )
    for name in names("decision"):
        big = [r for r in load(name)["rows"] if r["endpoints"] >= 1000]
        worst = max(big, key=lambda r: r["p99_us"])
        churn = ", new snapshot every cycle" if worst["churn"] else ""
        rows.append(
            [
                f"decision p99 ≤ {TARGET_DECISION_P99_US / 1000:g} ms at 1,000 endpoints",
                f"{name}, worst cell: {worst['prompt_bytes'] / 1024:.0f} KB{churn}",
                f"{worst['p99_us']:.0f} µs",
                verdict(all(r["p99_us"] <= TARGET_DECISION_P99_US for r in big)),
            ]
        )
    name = f"{MATRIX}groups-kv1.6"
    data = load(name)
    loads = loads_by_rate(data)
    seventy = next(rate for rate, load_ in loads.items() if load_ == 0.7)
    for policy in policies(data):
        if policy in ("round-robin", "least-request"):
            continue
        ratio = (
            row_at(data, policy, seventy)["ttft_p90_ms"]
            / row_at(data, "round-robin", seventy)["ttft_p90_ms"]
        )
        rows.append(
            [
                "p90 TTFT ≤ 1/3 of round robin's at load 0.7 (groups, 1.6 copies)",
                f"{name}: {policy}",
                f"{ratio:.2f}x",
                verdict(ratio <= TARGET_P90_VS_RR),
            ]
        )
        worst = max(row_at(data, policy, rate)["warm_miss_rate"] for rate in loads)
        rows.append(
            [
                f"warm misses ≤ {TARGET_WARM_MISS:.0%} at every load (groups, 1.6 copies)",
                f"{name}: {policy}",
                f"worst {worst:.0%}",
                verdict(worst <= TARGET_WARM_MISS),
            ]
        )
    rows += shared_prefix_targets()
    rows += lora_targets()
    return [
        "## Targets",
        "",
        "Read from the files below; policy names are the files' own (see the note under "
        "each routing table).",
        "",
        *table(["target", "where", "measured", "verdict"], rows, right_from=9),
    ]


def pd_section() -> list[str]:
    out = ["## Prefill/decode split", ""]
    for name in names("pd"):
        data = load(name)
        meta = data["meta"]
        if meta["quick"]:
            kind = "a short run on a shared machine"
        elif meta.get("command", "python -m bench.pd") == "python -m bench.pd":
            kind = "the full run"
        else:
            kind = "part of the matrix"
        out += [f"### {link(name)}: {kind}, {meta['started']}", ""]
        out += [line for line in pd_report.reading(meta, data["rows"]) if line.startswith("* ")]
        out.append("")
    return out[:-1]


def runs_section(
    heading: str, prefix: str, table: Callable[[list[dict[str, Any]]], list[str]], target: str
) -> list[str]:
    """Every committed ``PREFIX*.json`` run: its date, its note, its table of rows."""
    out = [f"## {heading}", ""]
    for name in names(prefix):
        data = load(name)
        meta = data["meta"]
        out += [f"### {link(name)}: {meta['date']}", ""]
        if meta.get("note"):
            out += [meta["note"], ""]
        out += [*table(data["rows"]), ""]
    if len(out) == 2:
        out += [f"No run committed yet: `make {target}` writes one.", ""]
    return out[:-1]


def inference_perf_section() -> list[str]:
    return runs_section(
        "inference-perf as the client",
        "inference-perf",
        inference_perf_report.table,
        "bench-inference-perf",
    )


def vllm_section() -> list[str]:
    section = runs_section(
        "Routing on real vLLM servers", "vllm-routing", vllm_routing_report.table, "bench-vllm"
    )
    return [*section, "", vllm_routing_report.NOISE]


def benchmarks_table() -> list[str]:
    rows = [[name, f"`make bench-{name}`", what] for name, what in BENCHMARKS]
    return table(["benchmark", "run it", "what it measures"], rows, right_from=9)


def lora_targets() -> list[list[str]]:
    """Adapter loads per 100 requests and TTFT p90 at most half round robin's: LoRA-aware
    placement should halve the swaps and the waits they cause."""
    results = {r["policy"]: r for r in load("lora")["results"]}
    rr = results["round-robin"]
    rows = []
    for policy, r in results.items():
        if policy == "round-robin":
            continue
        loads = r["loads_per_100"] / rr["loads_per_100"]
        p90 = r["ttft_p90_ms"] / rr["ttft_p90_ms"]
        rows.append(
            [
                f"adapter loads / 100 requests and TTFT p90 ≤ {TARGET_LORA_VS_RR:g}x round "
                "robin's (LoRA churn)",
                f"lora ({load('lora')['meta']['label'].split(':')[0]}): {policy}",
                f"loads {loads:.2f}x, p90 {p90:.2f}x",
                verdict(loads <= TARGET_LORA_VS_RR and p90 <= TARGET_LORA_VS_RR),
            ]
        )
    return rows


def lora_section() -> list[str]:
    data = load("lora")
    meta = data["meta"]
    rows = [
        [
            r["policy"],
            f"{r['loads_per_100']:.1f}",
            f"{r['ttft_p50_ms']:.0f}",
            f"{r['ttft_p90_ms']:.0f}",
            f"{r['ttft_p99_ms']:.0f}",
        ]
        for r in data["results"]
    ]
    header = ["policy", "loads / 100 req", "TTFT p50 ms", "TTFT p90 ms", "TTFT p99 ms"]
    lines = ["## LoRA adapter churn", "", f"### {link('lora')}: {meta['label']}", ""]
    lines += table(header, rows)
    if meta.get("note"):
        lines += ["", meta["note"]]
    return lines


def render() -> str:
    intro, outro = INTRO.split("{benchmarks}\n")
    sections = [
        [*intro.splitlines(), *benchmarks_table(), "", *outro.rstrip("\n").splitlines()],
        before_vllm_cache_section(),
        targets_section(),
        overhead_section(),
        decision_section(),
        scrape_section(),
        fairness_section(),
        routing_section(),
        lora_section(),
        pd_section(),
        inference_perf_section(),
        vllm_section(),
        ["## Other measurements", "", *[f"- {m}" for m in OTHER_MEASUREMENTS]],
    ]
    return "\n\n".join("\n".join(s) for s in sections) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.results_index", description=__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 if the page is stale")
    args = parser.parse_args(argv)
    text = render()
    current = INDEX.read_text() if INDEX.exists() else ""
    if args.check:
        if current != text:
            print(f"{INDEX} is out of date: run python -m bench.results_index")
            return 1
        return 0
    if current != text:
        INDEX.write_text(text)
        print(f"wrote {INDEX}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
