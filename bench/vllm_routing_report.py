"""bench.vllm_routing's numbers: vLLM's own counters per server, their deltas over a
run, the report's rows, table and result files (``NAME.md`` and ``NAME.json``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from bench.result_files import policy_lines, run_header, write_pair

NONE = "\N{EN DASH}"
HITS = "vllm:prefix_cache_hits_total"
QUERIES = "vllm:prefix_cache_queries_total"
SUCCESS = "vllm:request_success_total"
NOISE = (
    "On this 2-core machine, where four vLLM servers, Envoy, the EPP and the load "
    "generator share the cores, timings are noisy (TTFT moves with whatever else runs); "
    "the hit rates are exact: they are vLLM's own counters."
)
HEADER = [
    "policy",
    "rate req/s",
    "sent",
    "completed",
    "errors",
    "vLLM prefix-cache hit %",
    "hit / queried tokens",
    "TTFT p50 ms",
    "TTFT p90 ms",
    "requests per server",
]


def counters(metrics_text: str) -> dict[str, float]:
    """One server's prefix-cache hits and queries (tokens) and finished requests, every
    label summed, from its /metrics; keyed as bench.routing.summarize reads them."""
    sums = {HITS: 0.0, QUERIES: 0.0, SUCCESS: 0.0}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name in sums:
                sums[sample.name] += sample.value
    return {
        "prefix_cache_hits_tokens": sums[HITS],
        "prefix_cache_queries_tokens": sums[QUERIES],
        "requests_done": sums[SUCCESS],
    }


def kv_index_view(metrics_text: str) -> dict[str, float]:
    """The EPP's precise index at a glance, from its /metrics: endpoints by state
    (``endpoints_trusted``, ...) and KV-event stream counters (``events_gaps``, ...),
    every plugin summed. Empty for an EPP without the precise scorer."""
    view: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name == "epp_kv_index_endpoints":
                key = f"endpoints_{sample.labels['state']}"
            elif sample.name == "epp_kv_event_total":
                key = f"events_{sample.labels['kind']}"
            else:
                continue
            view[key] = view.get(key, 0.0) + sample.value
    return view


def kv_index_lines(views: dict[str, dict[str, float]]) -> list[str]:
    """One line per policy whose EPP kept a precise index: how it stood after the run."""
    lines = []
    for policy, v in views.items():
        if not v:
            continue
        lines.append(
            f"- `{policy}`, after its last rate: the EPP's precise index followed "
            f"{v.get('endpoints_trusted', 0):.0f} servers' KV events as trusted and "
            f"{v.get('endpoints_untrusted', 0):.0f} as untrusted (a server that published "
            f"nothing since the EPP started is in neither); "
            f"{v.get('events_events', 0):,.0f} events, {v.get('events_gaps', 0):.0f} gaps, "
            f"{v.get('events_decode_errors', 0):.0f} decode errors"
        )
    return lines


def deltas(before: Sequence[dict[str, Any]], after: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """What a run moved: hit and queried tokens summed over the servers, their ratio
    (NaN when nothing was queried), and each server's finished requests."""
    moved = [
        {k: b[k] - a[k] for k in ("prefix_cache_hits_tokens", "prefix_cache_queries_tokens")}
        | {"requests_done": b["requests_done"] - a["requests_done"]}
        for a, b in zip(before, after, strict=True)
    ]
    hits = sum(m["prefix_cache_hits_tokens"] for m in moved)
    queries = sum(m["prefix_cache_queries_tokens"] for m in moved)
    return {
        "vllm_hit_tokens": round(hits),
        "vllm_query_tokens": round(queries),
        "vllm_hit_rate": hits / queries if queries else math.nan,
        "per_server": {
            a["instance"]: round(m["requests_done"]) for a, m in zip(before, moved, strict=True)
        },
    }


def report_row(row: dict[str, Any], moved: dict[str, Any]) -> dict[str, Any]:
    """A bench.routing row (one policy at one rate) cut to what this report shows, with
    the servers' counter deltas."""
    keep = ("policy", "rate", "duration_s", "sent", "ok", "errors", "error_kinds")
    out = {k: row[k] for k in keep}
    out |= {k: _finite(row[k]) for k in ("ttft_p50_ms", "ttft_p90_ms", "throughput_rps")}
    return out | {"cpu": row["cpu"]} | moved | {"vllm_hit_rate": _finite(moved["vllm_hit_rate"])}


def _finite(value: float) -> float | None:
    """None for NaN (nothing measured): JSON has no NaN."""
    return None if math.isnan(value) else value


def _ms(value: float | None) -> str:
    return NONE if value is None else f"{value:.0f}"


def table(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The markdown table of ``rows`` (:func:`report_row`), one line per policy and rate."""
    lines = ["| " + " | ".join(HEADER) + " |", "|---" + "|---:" * (len(HEADER) - 1) + "|"]
    for r in rows:
        rate = r["vllm_hit_rate"]
        cells = [
            r["policy"],
            f"{r['rate']:g}",
            str(r["sent"]),
            str(r["ok"]),
            str(r["errors"]) + "".join(f" {k}:{n}" for k, n in sorted(r["error_kinds"].items())),
            NONE if rate is None else f"{100 * rate:.1f}",
            f"{r['vllm_hit_tokens']:,} / {r['vllm_query_tokens']:,}",
            _ms(r["ttft_p50_ms"]),
            _ms(r["ttft_p90_ms"]),
            " ".join(str(n) for n in r["per_server"].values()),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def markdown(meta: dict[str, Any], rows: Sequence[dict[str, Any]]) -> str:
    wl = meta["workload"]
    lines = [
        *run_header(f"Routing on real vLLM servers: {meta['title']}", meta),
        NOISE,
        "",
        f"{meta['servers']} vLLM {meta['vllm_version']} CPU servers on the tiny random "
        f"Llama (`tests/vllm/build_model.py`), each `{' '.join(meta['server_args'])}` "
        f"({meta['kv_blocks'] - 1} usable KV blocks of {meta['block_size']} tokens; prefix "
        "caching on, KV events published), their prefix caches reset before each policy. "
        f"Workload (`bench/workload.py`, groups): {wl['groups']} groups of equal "
        f"popularity, each sharing a system prompt of {meta['prefix_model_tokens']} model "
        f"tokens ({meta['prefix_blocks']} full blocks; all prefixes together "
        f"{meta['all_prefix_blocks']} blocks), a unique question of "
        f"{meta['question_model_tokens'][0]}-{meta['question_model_tokens'][1]} tokens, "
        f"{wl['output_tokens'][0]}-{wl['output_tokens'][1]} output tokens (`ignore_eos`), "
        "streaming chat completions with Poisson arrivals (bench.routing's load "
        f"generator); {meta['warmup_s']:g} s of unmeasured warm-up at the lowest rate, "
        f"then each rate for {meta['duration_s']:g} s, in increasing order. The hit rate "
        "is `vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total`, their "
        "deltas over the rate's run summed over the servers; requests per server are "
        "`vllm:request_success_total` deltas; errors include requests still running "
        f"{meta['drain_timeout_s']:g} s after the last arrival (`timeout`).",
        "",
        *policy_lines(meta["policies"]),
        "",
        *table(rows),
        "",
    ]
    if kv := kv_index_lines(meta.get("epp_kv_index", {})):
        lines += [*kv, ""]
    return "\n".join(lines)


def write_results(
    out: Path, name: str, meta: dict[str, Any], rows: Sequence[dict[str, Any]]
) -> None:
    write_pair(out, name, {"meta": meta, "rows": list(rows)}, markdown(meta, rows))
