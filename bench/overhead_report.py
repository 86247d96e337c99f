"""bench.overhead's report (pure): its tables per cell, the new/old CPU ratios of an
A/B run, the CPU per streamed chunk, and how to read them."""

from __future__ import annotations

from typing import Any

from bench import overhead_ab, workers

# The target for the EPP's added latency with 220 KB prompts at concurrency 20: small
# beside a model server's own time to first token, so routing never shows to a user.
TARGET_ADDED_MS = 5.0
# A cell this busy is CPU-bound: latency there is mostly queueing for the cores.
SATURATED = 0.9
# Other work on the machine above this many cores skews a cell (marked in the reading).
BUSY_NEIGHBOURS = 0.25

Cell = tuple[float, int, int, list[dict[str, Any]]]
# the minimal Python picker's path key and process (bench/minimal_picker.py)
PICKER = "picker"


def workload(chunks: int) -> str:
    """A row's ``stream_chunks`` in words: 0, a one-token completion; -N, N - 1 tokens
    answered in one piece (the reference of a streamed run); N, the same streamed in N
    chunks (a chunk per token, then the usage with ``[DONE]``)."""
    if chunks == 0:
        return "1 token"
    tokens = f"{abs(chunks) - 1} tokens"
    return f"{tokens} streamed in {chunks} chunks" if chunks > 0 else f"{tokens} in one piece"


def cells(rows: list[dict[str, Any]]) -> list[Cell]:
    """(server ms, stream chunks, concurrency, rows) per table, a streamed cell after its
    one-piece reference; each table's first row is Envoy alone."""

    def key(r: dict[str, Any]) -> tuple[float, int, int]:
        return (r.get("server_ms", 0.0), r.get("stream_chunks", 0), r["concurrency"])

    keys = sorted({key(r) for r in rows}, key=lambda k: (k[0], k[2], abs(k[1]), k[1]))
    return [(ms, ch, c, [r for r in rows if key(r) == (ms, ch, c)]) for ms, ch, c in keys]


def cell_label(server_ms: float, chunks: int, concurrency: int) -> str:
    server = "instant servers" if server_ms == 0 else f"servers taking {server_ms:g} ms"
    what = f", {workload(chunks)}" if chunks else ""
    return f"Concurrency {concurrency}, {server}{what}"


def markdown(
    meta: dict[str, Any], rows: list[dict[str, Any]], ab: list[dict[str, Any]]
) -> list[str]:
    """The whole ``NAME.md``: ``rows`` are the medians, ``ab`` the new/old ratios."""
    repeats = int(meta.get("repeats", 1))
    what = (
        f"completions of {abs(meta['stream_chunks']) - 1} tokens, in one piece and streamed"
        if meta.get("stream_chunks")
        else "non-streaming completions"
    )
    medians = f"; each figure the median of {repeats} runs of its cell" if repeats > 1 else ""
    lines = [
        "# Overhead: Envoy alone vs Envoy + EPP",
        "",
        f"Measured {meta['date']} on {meta['machine']}, code at {meta.get('git', 'unknown')}, "
        f"with `{meta['command']}` ({meta['duration_s']:g} s per cell, {meta['servers']} "
        f"simulators, {what} with a {meta['prompt_bytes']:,}-byte prompt, each Envoy with "
        f"`--concurrency 1`, closed-loop keep-alive clients{medians}). Everything shares the "
        "same cores, so compare rows within one table, not absolute numbers across "
        "machines. *machine busy* is the share of all cores in use during the cell "
        "(everything on the machine, not only this run).",
        "",
    ]
    other = meta.get("also_from")
    if other:
        lines += [
            f"Rows marked ({other['name']}) ran the epp package of that checkout (at "
            f"{other['git']}), each measured just before the same path on this code."
            + "".join(f" {k}: {why}." for k, why in meta.get("also_from_notes", {}).items()),
            "",
        ]
    for server_ms, chunks, c, cell in cells(rows):
        base = cell[0]
        lines += [
            f"## {cell_label(server_ms, chunks, c)}",
            "",
            "| path | req/s | p50 ms | p99 ms | added p50 ms | added p99 ms "
            "| EPP CPU µs/req | EPP req/s per core | Envoy CPU µs/req "
            "| servers + client CPU µs/req | machine busy | other work (cores) | errors |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in cell:
            epp_cpu = r.get("epp_cpu_us_per_req")
            lines.append(
                f"| {r['path']} | {r['rps']:.0f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} "
                f"| {r['p50_ms'] - base['p50_ms']:+.2f} | {r['p99_ms'] - base['p99_ms']:+.2f} "
                f"| {f'{epp_cpu:.0f}' if epp_cpu else '-'} "
                f"| {f'{1e6 / epp_cpu:.0f}' if epp_cpu else '-'} "
                f"| {r['envoy_cpu_us_per_req']:.0f} "
                f"| {r['sims_cpu_us_per_req'] + r['client_cpu_us_per_req']:.0f} "
                f"| {r['machine_busy']:.0%} | {r['other_cores']:.2f} | {r['errors']:.0f} |"
            )
        lines.append("")
    lines += ab_lines(ab, rows)
    lines += chunk_lines(rows)
    lines += workers.table(rows)
    lines += reading(rows, int(meta["cores"]))
    return lines


def ab_lines(ab: list[dict[str, Any]], rows: list[dict[str, Any]]) -> list[str]:
    """The A/B table: per path and cell, both sides' median EPP CPU per request and the
    median of the repeats' new/old ratios."""
    if not ab:
        return []
    lines = [
        "## A/B: EPP CPU per request, new / old",
        "",
        "Each repeat measured the old checkout's row, then this code's; *ratio* is the "
        "median of the repeats' new / old (below 1: the new code costs less), *each "
        "repeat* lists them in order.",
        "",
        "| path | cell | old µs/req | new µs/req | ratio | each repeat |",
        "|---|---|---:|---:|---:|---|",
    ]
    for a in ab:
        same = [
            r
            for r in rows
            if r.get("key") == a["key"]
            and (r.get("server_ms", 0.0), r.get("stream_chunks", 0), r["concurrency"])
            == (a["server_ms"], a["stream_chunks"], a["concurrency"])
        ]
        old = next(r for r in same if r["side"] == "old")
        new = next(r for r in same if r["side"] == "new")
        each = " ".join(f"{x:.2f}" for x in a["ratios"])
        lines.append(
            f"| {new['path']} | {cell_label(a['server_ms'], a['stream_chunks'], a['concurrency'])} "
            f"| {old['epp_cpu_us_per_req']:.0f} | {new['epp_cpu_us_per_req']:.0f} "
            f"| {a['ratio']:.2f} | {each} |"
        )
    return [*lines, ""]


def chunk_pairs(rows: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(one-piece row, streamed row) of each EPP path and cell of a streamed run."""
    pairs = []
    for r in rows:
        if r.get("stream_chunks", 0) <= 0 or "epp_cpu_us_per_req" not in r:
            continue
        plain = next(
            (
                p
                for p in rows
                if p["path"] == r["path"]
                and p["concurrency"] == r["concurrency"]
                and p.get("server_ms", 0.0) == r.get("server_ms", 0.0)
                and p.get("stream_chunks") == -r["stream_chunks"]
            ),
            None,
        )
        if plain is not None:
            pairs.append((plain, r))
    return pairs


def chunk_lines(rows: list[dict[str, Any]]) -> list[str]:
    """EPP CPU per streamed response chunk, per path and concurrency."""
    pairs = chunk_pairs(rows)
    if not pairs:
        return []
    lines = [
        "## EPP CPU per streamed response chunk",
        "",
        "Measured directly: the EPP's CPU per request streamed minus in one piece, over "
        "the ext_proc messages Envoy sent the EPP more per request (Envoy's "
        "`ext_proc.stream_msgs_sent` counter: the chunks that reached the EPP one by "
        "one). Both CPU figures are net of the EPP's idle work (scrapes, timers: its CPU "
        "per second with no request, measured before each cell, over the cell's req/s), "
        "which at a few streams per second would outweigh the requests' own.",
        "",
        "| path | concurrency | EPP idle ms/s | EPP µs/req in one piece | streamed "
        "| messages to the EPP per request (one piece / streamed) | EPP µs per chunk |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for plain, streamed in pairs:
        per_chunk = overhead_ab.per_chunk_us(plain, streamed)
        msgs = (
            f"{plain['extproc_msgs_per_req']:.1f} / {streamed['extproc_msgs_per_req']:.1f}"
            if "extproc_msgs_per_req" in streamed and "extproc_msgs_per_req" in plain
            else "-"
        )
        idle = streamed.get("epp_idle_cpu_us_per_s")
        lines.append(
            f"| {streamed['path']} | {streamed['concurrency']} "
            f"| {'-' if idle is None else f'{idle / 1000:.1f}'} "
            f"| {overhead_ab.request_cpu_us(plain):.0f} "
            f"| {overhead_ab.request_cpu_us(streamed):.0f} "
            f"| {msgs} | {'-' if per_chunk is None else f'{per_chunk:.1f}'} |"
        )
    return [*lines, ""]


def cpu_bound_ms(row: dict[str, Any], cores: int) -> float:
    """The latency a saturated closed loop predicts: each of ``concurrency`` requests
    waits for everyone's CPU, on the cores other work leaves to this run."""
    cpu_us = sum(float(row[f"{k}_cpu_us_per_req"]) for k in ("envoy", "sims", "client"))
    cpu_us += float(row.get("epp_cpu_us_per_req", 0.0))
    free = max(cores - float(row["other_cores"]), 0.1)
    return float(row["concurrency"]) * cpu_us / free / 1000


def reading(rows: list[dict[str, Any]], cores: int) -> list[str]:
    """How to read the tables, from their own numbers. With servers that take time the
    machine has room to spare, so *added* is the EPP path's own latency (set against
    the target). A saturated closed loop is CPU-bound instead: latency ~ concurrency x
    CPU per request (every process of the run) / the cores left by other work, so the
    EPP's added latency is mostly the CPU it and Envoy add, paid by every request."""
    lines = ["## Reading", ""]
    for server_ms, chunks, c, cell in cells(rows):
        base, paths = cell[0], cell[1:]
        busy = max(r["machine_busy"] for r in cell)
        own = max(r["machine_busy"] * cores - r["other_cores"] for r in cell)
        head = (
            f"- **{cell_label(server_ms, chunks, c)}"
            + f"** (machine {busy:.0%} busy at most; this run's processes used up to "
            f"{own:.1f} of {cores} cores): "
        )
        if server_ms > 0 or c <= cores or busy < SATURATED:  # not a CPU-bound loop
            added = [
                (r["path"], r["p50_ms"] - base["p50_ms"], r["p99_ms"] - base["p99_ms"],
                 max(r["other_cores"], base["other_cores"]) > BUSY_NEIGHBOURS)
                for r in paths
            ]  # fmt: skip
            met = sum(a[1] <= TARGET_ADDED_MS and a[2] <= TARGET_ADDED_MS for a in added)
            lines.append(
                head + "the run leaves CPU to spare, so *added* is each path's own latency "
                "(p50 / p99): "
                + "; ".join(
                    f"{name} {p50:+.1f} / {p99:+.1f} ms{'*' if noisy else ''}"
                    for name, p50, p99, noisy in added
                )
                + f". Within the ≤ {TARGET_ADDED_MS:g} ms target at both: "
                f"{met} of {len(added)} paths."
                + (
                    f" (* other work took > {BUSY_NEIGHBOURS:g} cores during this cell or "
                    "Envoy alone's: its numbers include that queueing.)"
                    if any(a[3] for a in added)
                    else ""
                )
            )
            continue
        predicted_base = cpu_bound_ms(base, cores)
        lines.append(
            head + f"CPU-bound. Predicted p50 = {c} x CPU per request of all the run's "
            f"processes / the {cores} cores less other work; Envoy alone "
            f"{predicted_base:.0f} predicted vs {base['p50_ms']:.0f} ms measured. "
            "Added p50, predicted vs measured: "
            + "; ".join(
                f"{r['path']} {cpu_bound_ms(r, cores) - predicted_base:+.0f} vs "
                f"{r['p50_ms'] - base['p50_ms']:+.0f} ms"
                for r in paths
            )
            + "."
        )
    lines.append("")
    return lines
