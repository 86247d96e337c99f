"""bench.routing's report: the Markdown table and its reading, the JSON, the plots."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import orjson

from bench.workload import CHARS_PER_TOKEN


def mean_range(lo_hi: tuple[int, int]) -> float:
    return (lo_hi[0] + lo_hi[1]) / 2


def sim_tokens_per_token(meta: dict[str, Any]) -> int:
    """The simulators' tokens per workload token: with KV events on they count bytes."""
    return CHARS_PER_TOKEN if meta.get("kv_events") else 1


def cached_share(meta: dict[str, Any], sim: dict[str, Any]) -> str:
    """The share of the groups a fully loaded server's free KV can cache (for the report)."""
    wl = meta["workload"]
    block = sim["block_size"] / sim_tokens_per_token(meta)
    request = wl["prefix_tokens"] + mean_range(wl["question_tokens"])
    request += mean_range(wl["output_tokens"])
    free = sim["kv_blocks"] - sim["max_num_seqs"] * math.ceil(request / block)
    share = max(free, 0) / math.ceil(wl["prefix_tokens"] / block) / wl["groups"]
    return f"{share:.0%}"


def reading(meta: dict[str, Any], rows: list[dict[str, Any]]) -> tuple[float, list[str]]:
    """The rate closest to 80 % of the reference's measured capacity, and what to read there."""
    names = list(meta["policies"])
    ref = "round-robin" if "round-robin" in names else names[0]
    ref_rows = [r for r in rows if r["policy"] == ref]
    best = max(r["throughput_rps"] for r in ref_rows)
    top = ref_rows[-1]
    saturated = top["throughput_rps"] < 0.9 * top["rate"]
    calibrated = meta.get("calibrated_capacity_rps")
    capacity = calibrated if calibrated and ref == "round-robin" else best
    target = 0.8 * capacity
    rate = min(meta["rates"], key=lambda r: abs(r - target))
    at = {r["policy"]: r for r in rows if r["rate"] == rate}
    base = at[ref]
    lines = [
        (
            f"Round robin's capacity, measured by the calibration run, is {capacity:.1f} "
            f"req/s; in the table it completed at most {best:.1f} req/s"
            if capacity is calibrated
            else f"{ref} completed at most {best:.1f} req/s"
        )
        + (
            f" (its highest offered rate, {top['rate']:g} req/s, is beyond saturation)."
            if saturated
            else f" and did **not** saturate at the highest rate ({top['rate']:g} req/s): "
            "its capacity is higher, raise --loads/--rates."
        ),
        f"At {rate:g} req/s (closest to 80 % of {capacity:.1f}), p90 TTFT relative to "
        f"{ref} ({base['ttft_p90_ms']:.0f} ms):",
        "",
    ]
    for name in names:
        r = at[name]
        mean = sum(r["per_server"].values()) / max(len(r["per_server"]), 1)
        over = [s for s, n in r["per_server"].items() if n > 2 * mean]
        lines.append(
            f"- **{name}**: p90 TTFT {r['ttft_p90_ms']:.0f} ms = "
            f"{r['ttft_p90_ms'] / base['ttft_p90_ms']:.2f}x {ref} "
            f"(p50 {r['ttft_p50_ms']:.0f} ms, prefix-cache hit rate {r['prefix_hit_rate']:.0%}, "
            f"warm misses {percent(r.get('warm_miss_rate'))}); "
            f"busiest server {r['load_max_mean']:.2f}x the mean load, "
            + (f"**{', '.join(over)} above 2x the mean**" if over else "none above 2x the mean")
            + f"; {r['errors']} errors."
        )
    return rate, lines + ratio_table(meta, rows)


def percent(value: float | None) -> str:
    return "n/a" if value is None or math.isnan(value) else f"{value:.0%}"


def ratio_table(meta: dict[str, Any], rows: list[dict[str, Any]]) -> list[str]:
    """Every policy's p90 TTFT over ``ideal``'s and round robin's, at every rate."""
    names = list(meta["policies"])
    refs = [r for r in ("ideal", "round-robin") if r in names]
    if not refs:
        return []
    p90 = {(r["policy"], r["rate"]): r["ttft_p90_ms"] for r in rows}
    rates = meta["rates"]
    lines = [
        "",
        "p90 TTFT of each policy divided by "
        + " and by ".join(f"**{r}**'s at the same rate" for r in refs)
        + " (below 1: faster):",
        "",
        "| policy | " + " | ".join(f"{rate:g} req/s" for rate in rates) + " |",
        "|---|" + "---:|" * len(rates),
    ]
    for name in names:
        cells = []
        for rate in rates:
            mine = p90.get((name, rate), math.nan)
            cells.append(
                " / ".join(f"{mine / p90.get((ref, rate), math.nan):.2f}x" for ref in refs)
            )
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def describe_workload(wl: dict[str, Any]) -> str:
    """One Markdown sentence on the workload of ``meta["workload"]``."""
    kind = wl.get("kind", "groups")
    groups_how = f"Zipf(s={wl['skew']:g})" if wl["skew"] else "uniformly"
    lengths = (
        f"a {wl['question_tokens'][0]}-{wl['question_tokens'][1]}-token question, "
        f"{wl['output_tokens'][0]}-{wl['output_tokens'][1]} output tokens asked for (uniform "
        "draws)"
    )
    tail = (
        "; streaming chat completions with `stream_options.include_usage`; Poisson "
        "arrivals, open loop."
    )
    if kind == "control":
        return (
            f"every request has a system prompt of its own ({wl['prefix_tokens']} tokens, "
            f"shared with no other request) and {lengths}: no prefix can be reused, so "
            "prefix affinity cannot help (least request is the yardstick; `ideal` is round "
            "robin by request here)" + tail
        )
    if kind == "multi-turn":
        return (
            f"chat sessions, each opening with the system prompt of one of {wl['groups']} "
            f"groups ({wl['prefix_tokens']} tokens, group chosen {groups_how}); "
            f"{wl['turns'][0]}-{wl['turns'][1]} turns per session, each with {lengths}; turn "
            "k resends every earlier turn's question and (stand-in) answer; sessions start "
            f"as a Poisson process, {wl['think_s']:g} s mean (exponential) from one turn's "
            "arrival to the next, the session in `x-session-id`; `ideal` pins a session to "
            "its group's server" + tail
        )
    return (
        f"{wl['groups']} groups, each with its own {wl['prefix_tokens']}-token system prompt; "
        f"each request adds {lengths}, group chosen {groups_how}" + tail
    )


def oracle_line(meta: dict[str, Any]) -> list[str]:
    """What the oracle policies assigned, for those that ran."""
    oracle = meta.get("oracle") or {}
    lines = []
    for name in meta["policies"]:
        if name not in oracle:
            continue
        if oracle[name]["assignment"] is None:
            lines.append(f"- **{name}**: round robin by request (no groups to keep together).")
            continue
        servers: dict[int, list[int]] = {}
        for group, homes in enumerate(oracle[name]["assignment"]):
            for server in homes:
                servers.setdefault(server, []).append(group)
        shares = "; ".join(
            f"server {k}: groups {', '.join(map(str, gs))} ({oracle[name]['server_loads'][k]:.0%})"
            for k, gs in sorted(servers.items())
        )
        lines.append(
            f"- **{name}**: at most {oracle['groups_per_server']} groups per server (what "
            "its free KV under load holds), groups by popularity onto the least loaded "
            f"server (share of the traffic in parentheses): {shares}."
        )
    return lines


def write_results(
    out: Path, name: str, meta: dict[str, Any], rows: list[dict[str, Any]], per_request: bool
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    rate80, read = reading(meta, rows)
    meta["reading_rate"] = rate80
    summary = [{k: v for k, v in r.items() if k != "requests"} for r in rows]
    (out / f"{name}.json").write_bytes(
        orjson.dumps({"meta": meta, "rows": summary}, option=orjson.OPT_INDENT_2)
    )
    if per_request:
        raw = [{"policy": r["policy"], "rate": r["rate"], **r["requests"]} for r in rows]
        (out / f"{name}_requests.json").write_bytes(orjson.dumps(raw))
    plot_ttft(out / f"{name}_ttft.png", meta, rows)
    plot_load(out / f"{name}_load.png", meta, rows, rate80)
    wl, sim = meta["workload"], meta["sim"]
    kind = wl.get("kind", "groups")
    calibration = f"{meta['estimated_capacity_rps']:.1f} req/s from the latency model"
    if meta["calibrated_capacity_rps"] is not None:
        calibration = (
            f"{meta['calibrated_capacity_rps']:.1f} req/s measured by a calibration run "
            f"(fresh simulators, round robin at 1.5x the model's "
            f"{meta['estimated_capacity_rps']:.1f} req/s for {meta['calibrate_s']:g} s; output "
            "tokens/s of the requests completed in its last two thirds / mean output length)"
        )
    if meta["loads"]:
        calibration += f"; the rates are {', '.join(f'{x:g}' for x in meta['loads'])} x that"
    lines = [
        f"# Routing quality: TTFT, cache use and load balance ({kind} workload)",
        "",
        f"Measured {meta['date']} on {meta['machine']}, code at {meta['git']}, in "
        f"{meta['elapsed_s']:.0f} s, with",
        "",
        f"    {meta['command']}",
        "",
        "Everything (Envoy, the EPP, the simulators and the load generator) shares the same "
        f"cores. CPU columns are % of one core ({os.cpu_count()} cores = "
        f"{(os.cpu_count() or 1) * 100} %): the benchmark's processes, then `other` (whatever "
        "else ran on the machine meanwhile) and the whole machine. Compare policies within "
        "this file, not absolute numbers across machines.",
        "",
        "## Setup",
        "",
        f"- **Workload** (bench/workload.py `{kind}`, seed {wl['seed']}): " + describe_workload(wl),
        f"- **Simulators**: {meta['servers']} x `epp sim {' '.join(meta['sim_argv'])}`. "
        f"KV capacity {sim['kv_blocks']} blocks; all groups' prefixes need "
        f"{meta['all_prefix_blocks']}. Under load ({sim['max_num_seqs']} sequences holding "
        f"their blocks) a server has room for about {cached_share(meta, sim)} of the groups' "
        "prefixes, so no server caches every group. An uncached "
        f"{wl['prefix_tokens']}-token prefix costs "
        f"{sim['prefill_ms_per_token'] * wl['prefix_tokens'] * sim_tokens_per_token(meta):.0f}"
        " ms more prefill than a "
        "cached one. Fresh simulators for every policy (cold caches), then "
        f"{meta['warmup_s']:g} s unmeasured warm-up at the lowest rate, then the rates in "
        "increasing order with the caches carried over; every policy gets the identical "
        "request sequence.",
        f"- **Rates**: {', '.join(f'{r:g}' for r in meta['rates'])} req/s, "
        f"{meta['duration_s']:g} s of arrivals each, then up to {meta['drain_timeout_s']:g} s "
        "for outstanding requests (then counted as `timeout` errors). Round-robin "
        f"capacity {calibration}.",
        "- **Measured**: TTFT from the scheduled arrival to the first SSE chunk with "
        "content; e2e to the end of the stream; achieved = successful completions per second "
        "over the last three quarters of the arrival window (the offered rate below "
        "capacity, the capacity above it); load = requests per server (`x-sim-instance`), "
        "max/mean; prefix-cache hit rate = cached / prompt tokens over all simulators "
        "(`/sim/stats`); servers/group = distinct servers each group's requests went to; "
        "warm miss = of the requests whose prefix (group system prompt; multi-turn: the "
        "session's previous turn) an earlier request had already prefilled (warm-up "
        "included), the share whose `usage.prompt_tokens_details.cached_tokens` fell short "
        "of that prefix's full KV blocks (bench/warmth.py).",
        f"- **Envoy**: one per policy, `--concurrency 1`; EPP policies use processing mode "
        f"`{meta['processing']}`.",
        *oracle_line(meta),
        "",
        "| policy | what ran |",
        "|---|---|",
        *[f"| {n} | {p['describe']} |" for n, p in meta["policies"].items()],
        "",
        "## Results",
        "",
        "| policy | offered (arrived) req/s | achieved req/s | TTFT p50 ms | TTFT p90 ms "
        "| TTFT p99 ms | e2e p50 ms | errors | load max/mean | prefix hit | warm miss "
        "| servers/group | CPU % envoy/epp/sims/loadgen | CPU % other/machine |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in rows:
        c = r["cpu"]
        lines.append(
            f"| {r['policy']} | {r['rate']:g} ({r['sent'] / r['duration_s']:.1f}) "
            f"| {r['throughput_rps']:.1f} "
            f"| {r['ttft_p50_ms']:.0f} | {r['ttft_p90_ms']:.0f} | {r['ttft_p99_ms']:.0f} "
            f"| {r['e2e_p50_ms']:.0f} "
            f"| {r['errors']}{' ' + str(r['error_kinds']) if r['errors'] else ''} "
            f"| {r['load_max_mean']:.2f} | {r['prefix_hit_rate']:.0%} "
            f"| {percent(r.get('warm_miss_rate'))} "
            f"| {'n/a' if kind == 'control' else format(r['servers_per_group'], '.1f')} "
            f"| {c['envoy']:.0f}/{c.get('epp', 0):.0f}/{c['sims']:.0f}/{c['loadgen']:.0f} "
            f"| {c['other']:.0f}/{c['machine']:.0f} |"
        )
    lag = max(r["client_lag_max_ms"] for r in rows)
    lines += [
        "",
        f"Load generator: worst send lag behind schedule {lag:.1f} ms (p99 per cell ≤ "
        f"{max(r['client_lag_p99_ms'] for r in rows):.1f} ms).",
        *replica_shares(rows),
        "",
        "## Reading the table",
        "",
        *read,
        "",
        f"![TTFT vs rate]({name}_ttft.png)",
        "",
        f"![requests per server]({name}_load.png)",
        "",
    ]
    (out / f"{name}.md").write_text("\n".join(lines))
    print(f"wrote {out / name}.md, .json, _ttft.png, _load.png")


def replica_shares(rows: list[dict[str, Any]]) -> list[str]:
    """A line saying how Envoy spread the streams over each policy's EPP replicas (their
    ``epp_requests_total``), when a policy ran more than one."""
    cells = [
        f"{r['policy']} at {r['rate']:g} req/s "
        + "/".join(f"{n / max(sum(r['replica_requests']), 1):.0%}" for n in r["replica_requests"])
        for r in rows
        if len(r.get("replica_requests") or []) > 1
    ]
    if not cells:
        return []
    return ["", "Requests per EPP replica (their `epp_requests_total`): " + "; ".join(cells) + "."]


def plot_ttft(path: Path, meta: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for i, name in enumerate(meta["policies"]):
        mine = [r for r in rows if r["policy"] == name]
        x = [r["rate"] for r in mine]
        color = f"C{i}"
        axes[0].plot(x, [r["ttft_p50_ms"] for r in mine], "o-", color=color, label=name)
        axes[1].plot(x, [r["ttft_p90_ms"] for r in mine], "o-", color=color, label=name)
    plain = FuncFormatter(lambda v, _: f"{v:g}")
    for ax, title in zip(axes, ("TTFT p50", "TTFT p90"), strict=True):
        ax.set_title(title)
        ax.set_xlabel("offered load (req/s)")
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.grid(True, which="both", alpha=0.3)
        ax.axvline(meta["reading_rate"], color="grey", linestyle=":", linewidth=1)
    axes[0].set_ylabel("ms (log scale)")
    axes[0].legend()
    fig.suptitle(
        f"TTFT vs request rate ({meta['servers']} simulators, {meta['workload']['groups']} "
        f"prefix groups; dotted line: {meta['reading_rate']:g} req/s, ~80% of round-robin "
        "capacity)",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_load(path: Path, meta: dict[str, Any], rows: list[dict[str, Any]], rate: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(meta["policies"])
    at = {r["policy"]: r for r in rows if r["rate"] == rate}
    servers = sorted({s for r in at.values() for s in r["per_server"]})
    width = 0.8 / max(len(names), 1)
    fig, ax = plt.subplots(figsize=(8, 4))
    for i, name in enumerate(names):
        counts = [at[name]["per_server"].get(s, 0) for s in servers]
        xs = [j + (i - (len(names) - 1) / 2) * width for j in range(len(servers))]
        ax.bar(
            xs,
            counts,
            width,
            label=f"{name} (max/mean {at[name]['load_max_mean']:.2f})",
            color=f"C{i}",
        )
    total = sum(at[names[0]]["per_server"].values())
    mean = total / max(len(servers), 1)
    ax.axhline(mean, color="black", linestyle="--", linewidth=1, label="mean")
    ax.axhline(2 * mean, color="red", linestyle=":", linewidth=1, label="2x mean")
    ax.set_xticks(range(len(servers)), servers)
    ax.set_ylabel("requests")
    ax.set_ylim(0, 2.6 * mean)
    ax.set_title(f"Requests per server at {rate:g} req/s (~80% of round-robin capacity)")
    ax.legend(fontsize=8, ncol=2, loc="upper center")
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
