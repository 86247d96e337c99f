"""bench.inference_perf's result files: inference-perf's own numbers per policy and rate,
read from the per-stage reports it wrote (``stage_N_lifecycle_metrics.json``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.result_files import policy_lines, run_header, write_pair

NONE = "\N{EN DASH}"
HEADER = [
    "policy",
    "rate req/s",
    "achieved req/s",
    "ok",
    "errors",
    "KV-cache hit %",
    "TTFT mean ms",
    "TTFT p50 ms",
    "TTFT p90 ms",
    "ITL mean ms",
    "req/s done",
    "output tok/s",
    "count mismatches",
]


def _get(report: dict[str, Any], *path: str) -> Any:
    node: Any = report
    for key in path:
        if not isinstance(node, dict):
            return None
        node = node.get(key)
    return node


def row(policy: str, report: dict[str, Any]) -> dict[str, Any]:
    """One stage's numbers, as inference-perf reported them (times in ms; the KV-cache
    hit % is its ``prompt_tokens.cached`` over ``prompt_tokens.total``, the servers'
    ``usage.prompt_tokens_details.cached_tokens`` summed)."""
    ok = _get(report, "successes")
    latency = _get(ok, "latency")
    prompt = _get(ok, "prompt_tokens") or {}
    total = prompt.get("total") or 0.0

    def ms(metric: str, stat: str) -> float | None:
        value = _get(latency, metric, stat)
        return None if value is None else value * 1000

    return {
        "policy": policy,
        "rate": _get(report, "load_summary", "requested_rate"),
        "achieved_rate": _get(report, "load_summary", "achieved_rate"),
        "successes": _get(ok, "count"),
        "failures": _get(report, "failures", "count"),
        "kv_cache_hit_pct": 100 * prompt.get("cached", 0.0) / total if total else None,
        "ttft_mean_ms": ms("time_to_first_token", "mean"),
        "ttft_p50_ms": ms("time_to_first_token", "median"),
        "ttft_p90_ms": ms("time_to_first_token", "p90"),
        "itl_mean_ms": ms("inter_token_latency", "mean"),
        "requests_per_s": _get(ok, "throughput", "requests_per_sec"),
        "output_tokens_per_s": _get(ok, "throughput", "output_tokens_per_sec"),
        "token_count_mismatches": _get(ok, "token_count_mismatches"),
    }


def rows(stages: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Every policy's stages, ordered by rate, then policy."""
    out = [row(policy, report) for policy, reports in stages.items() for report in reports]
    return sorted(out, key=lambda r: r["rate"] or 0.0)


def _cell(value: Any, digits: int) -> str:
    if value is None:
        return NONE
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def table(data_rows: list[dict[str, Any]]) -> list[str]:
    """The markdown table of ``data_rows`` (:func:`rows`)."""
    keys = [
        ("policy", 0),
        ("rate", 1),
        ("achieved_rate", 2),
        ("successes", 0),
        ("failures", 0),
        ("kv_cache_hit_pct", 1),
        ("ttft_mean_ms", 0),
        ("ttft_p50_ms", 0),
        ("ttft_p90_ms", 0),
        ("itl_mean_ms", 1),
        ("requests_per_s", 2),
        ("output_tokens_per_s", 0),
        ("token_count_mismatches", 0),
    ]
    lines = ["| " + " | ".join(HEADER) + " |", "|---" + "|---:" * (len(HEADER) - 1) + "|"]
    for r in data_rows:
        lines.append("| " + " | ".join(_cell(r[k], d) for k, d in keys) + " |")
    return lines


def markdown(meta: dict[str, Any], data_rows: list[dict[str, Any]]) -> str:
    sim = meta["sim"]
    shared = meta["config"]["data"]["shared_prefix"]
    title = "inference-perf shared_prefix: Envoy round robin and the EPP on the simulators"
    lines = [
        *run_header(title, meta, meta["client"]),
        f"inference-perf's `shared_prefix` data, unchanged: {shared['num_groups']} groups "
        f"of {shared['system_prompt_len']}-token system prompts, "
        f"{shared['num_prompts_per_group']} questions of {shared['question_len']} tokens "
        f"per group, {shared['output_len']} output tokens; streaming completions; one "
        f"Poisson stage per rate, {meta['duration_s']} s each, in increasing order. "
        f"{meta['servers']} simulators per policy, fresh, {sim['max_num_seqs']} running "
        f"sequences each, {sim['kv_blocks']} KV blocks of {sim['block_size']} tokens (free "
        f"KV for {meta['prefix_copies']:g} copies of all prefixes), per-request timing "
        f"(`{' '.join(meta['sim_argv'])}`). Every number is inference-perf's, from its "
        "per-stage report (the raw reports are in the JSON file beside this one): "
        "KV-cache hit % is its cached prompt tokens over all prompt tokens (the servers' "
        "`cached_tokens`), *count mismatches* the requests whose prompt length the "
        "server counted differently from inference-perf's tokenizer.",
        "",
        *policy_lines({name: p["describe"] for name, p in meta["policies"].items()}),
        "",
        *table(data_rows),
        "",
    ]
    return "\n".join(lines)


def write_results(
    out: Path, name: str, meta: dict[str, Any], stages: dict[str, list[dict[str, Any]]]
) -> None:
    """``NAME.json`` (meta, the table's rows, inference-perf's reports) and ``NAME.md``."""
    data_rows = rows(stages)
    doc = {"meta": meta, "rows": data_rows, "reports": stages}
    write_pair(out, name, doc, markdown(meta, data_rows))
