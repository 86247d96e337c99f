"""bench.pd's report: the Markdown tables and their reading, the JSON, the plots."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

NONE = "\N{EN DASH}"  # an empty table cell
TARGET_LOAD = 0.7  # where the split is judged: ~70 % load, mixed workload
TARGET_ITL_P99 = 0.5  # split ITL p99 at most this multiple of aggregated's
TARGET_TTFT_P90 = 1.2  # with TTFT p90 at most this multiple


def cell(rows: list[dict[str, Any]], dep: str, wl: str, load: float) -> dict[str, Any] | None:
    for r in rows:
        if r["deployment"] == dep and r["workload"] == wl and r["load"] == load:
            return r
    return None


def fmt(v: Any) -> str:
    return NONE if v is None else f"{v:g}" if isinstance(v, float) else str(v)


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else round(a / b, 2)


def split_names(meta: dict[str, Any]) -> list[str]:
    return [d["name"] for d in meta["deployments"] if d["prefill"] and d["decider"] == "always"]


def decider_names(meta: dict[str, Any]) -> dict[str, str]:
    """decider -> deployment name on the decider ratio with nixl."""
    p, d = meta["decider_ratio"].split(":")
    out = {}
    for dep in meta["deployments"]:
        same_split = dep["prefill"] == int(p) and dep["decode"] == int(d)
        if same_split and dep["coordinator"] == "nixl" and not dep.get("defer"):
            out[dep["decider"]] = dep["name"]
    return out


def reading(meta: dict[str, Any], rows: list[dict[str, Any]]) -> list[str]:
    """The split's two targets (ITL p99 <= 0.5x and TTFT p90 <= 1.2x aggregated's: halve
    the decode tail without making the first token much later), read from the rows."""
    out = ["## Reading", ""]
    load = min(meta["loads"], key=lambda x: abs(x - TARGET_LOAD))
    agg = cell(rows, "aggregated", "mixed", load)
    splits: list[tuple[str, dict[str, Any]]] = []
    for n in split_names(meta):
        r = cell(rows, n, "mixed", load)
        if r is not None and r["itl_p99_ms"] is not None:
            splits.append((n, r))
    if agg is not None and splits:

        def judged(nr: tuple[str, dict[str, Any]]) -> tuple[bool, float, float]:
            itl = ratio(nr[1]["itl_p99_ms"], agg["itl_p99_ms"])
            ttft = ratio(nr[1]["ttft_p90_ms"], agg["ttft_p90_ms"])
            if itl is None or ttft is None:
                return False, float("inf"), float("inf")
            return itl <= TARGET_ITL_P99 and ttft <= TARGET_TTFT_P90, itl, ttft

        def rank(nr: tuple[str, dict[str, Any]]) -> tuple[bool, bool, float]:
            met, itl, ttft = judged(nr)
            itl_ok = itl <= TARGET_ITL_P99
            return not met, not itl_ok, ttft if itl_ok else itl

        # the best ratio: one that meets both if any, else the lowest TTFT among those
        # that meet the ITL target, else the lowest ITL
        best, row = min(splits, key=rank)
        met, itl, ttft = judged((best, row))
        out += [
            f"* Mixed workload at load {load:g}, the best split `{best}`: ITL p99 "
            f"{fmt(row['itl_p99_ms'])} ms against aggregated's "
            f"{fmt(agg['itl_p99_ms'])} ms ({fmt(itl)}x; target <= {TARGET_ITL_P99}x), "
            f"TTFT p90 {fmt(row['ttft_p90_ms'])} against {fmt(agg['ttft_p90_ms'])} ms "
            f"({fmt(ttft)}x; target <= {TARGET_TTFT_P90}x): "
            f"**{'met' if met else 'not met'}**.",
        ]
        per_request = []
        for dep in meta["deployments"]:
            r = cell(rows, dep["name"], "mixed", load)
            if dep["decider"] in ("always", "never") or r is None or r["itl_p99_ms"] is None:
                continue
            met, itl, ttft = judged((dep["name"], r))
            per_request.append(
                f"`{dep['name']}` {fmt(itl)}x / {fmt(ttft)}x ({'met' if met else 'not met'})"
            )
        if per_request:
            out.append(
                "* The same target for the deciders that split per request (ITL p99 / TTFT "
                "p90 against aggregated's): " + "; ".join(per_request) + "."
            )
    deciders = decider_names(meta)
    if "benefit" in deciders:
        verdicts = []
        for wl in meta["workloads"]:
            if not any(r["workload"] == wl for r in rows):
                continue  # not run
            wins = []
            for load_level in meta["loads"]:
                g = {d: cell(rows, n, wl, load_level) for d, n in deciders.items()}
                b = g.get("benefit")
                others = [g.get(x) for x in ("always", "never")]
                if b is None or any(o is None for o in others):
                    continue
                ok = all(b["goodput"] >= o["goodput"] for o in others if o is not None)
                wins.append((load_level, ok))
            lost = [f"{x:g}" for x, ok in wins if not ok]
            if not wins:
                verdicts.append(f"{wl}: no data")
            elif lost:
                verdicts.append(f"{wl}: **not met** at load {', '.join(lost)}")
            else:
                verdicts.append(f"{wl}: met at every load")
        slo = meta["slo"]
        out += [
            f"* Goodput (TTFT <= {slo['ttft_ms']:g} ms and the request's own p90 ITL <= "
            f"{slo['itl_ms']:g} ms), `benefit` against `always` and `never` on "
            f"{meta['decider_ratio']}: " + "; ".join(verdicts) + ".",
        ]
    return [*out, ""]


def table(meta: dict[str, Any], rows: list[dict[str, Any]], wl: str) -> list[str]:
    head = (
        "| deployment | load | req/s | TTFT p50 / p90 / p99 | ITL p50 / p90 / p99 | "
        "e2e p50 / p90 / p99 | ok req/s | tok/s | goodput | split | errors | CPU |"
    )
    out = [f"### {wl}", "", head, "|" + "---|" * 12]
    for dep in meta["deployments"]:
        for load in meta["loads"]:
            r = cell(rows, dep["name"], wl, load)
            if r is None:
                continue
            c = r["counters"]
            decided = sum(v for k, v in c.items() if k.startswith("decision:"))
            split = c.get("decision:disaggregated", 0) / decided if decided else None
            tri = [
                " / ".join(fmt(r[f"{m}_p{p}_ms"]) for p in (50, 90, 99))
                for m in ("ttft", "itl", "e2e")
            ]
            errors = ", ".join(f"{k} {v}" for k, v in r["errors"].items()) or "0"
            out.append(
                f"| {dep['name']} | {load:g} | {fmt(r['rate_rps'])} | {tri[0]} | {tri[1]} | "
                f"{tri[2]} | {fmt(r['throughput_rps'])} | {fmt(r['output_tokens_per_s'])} | "
                f"{fmt(r['goodput'])} | {NONE if split is None else f'{split:.0%}'} | "
                f"{errors} | {fmt(r['machine_cpu'])}% |"
            )
    return [*out, ""]


def markdown(meta: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    name = meta["name"]
    short = (
        "**A short run on a shared 2-core machine** (other work ran beside it; the CPU "
        "column is the whole machine's): few requests per cell, so p99s rest on a handful "
        "of samples. Read the direction, not the digits; `make bench-pd` is the full run."
        if meta["quick"]
        else f"{meta['duration_s']:g} s of arrivals per cell."
    )
    sim = ", ".join(f"--{k} {v}" for k, v in meta["sim"].items())
    lines = [
        f"# Prefill/decode split against aggregated ({name})",
        "",
        f"{short} {meta['label']}".rstrip(),
        "",
        f"Run {meta['started']} ({meta['minutes']} min) at {meta['git']} on "
        f"{meta['machine']}: `{command(meta)}`. "
        f"{meta['servers']} simulators per deployment, `{sim}`, `--time-scale "
        f"{meta['time_scale']:g}`; {meta['duration_s']:g} s of Poisson arrivals per cell. "
        "Latencies in simulated ms; load = offered rate / the aggregated pool's estimated "
        "capacity for the workload "
        + ", ".join(f"{k} {v:g} req/s" for k, v in meta["capacity_rps"].items())
        + ". *split*: the share of requests the EPP disaggregated; goodput: the share of "
        f"requests with TTFT <= {meta['slo']['ttft_ms']:g} ms and their own p90 ITL <= "
        f"{meta['slo']['itl_ms']:g} ms. ITL pools every gap between a request's tokens. "
        "*ok req/s* and *tok/s*: what completed, per second of the arrival window (with "
        "every request done that is the offered rate: saturation shows in TTFT and e2e).",
        "",
        "Workloads (share, prompt tokens, output tokens): "
        + "; ".join(
            f"{k}: "
            + ", ".join(f"{c[0]:g} x {c[1][0]}-{c[1][1]} -> {c[2][0]}-{c[2][1]}" for c in v)
            for k, v in meta["workloads"].items()
        )
        + ".",
        "",
        *reading(meta, rows),
        f"Plots: [{name}_itl.png]({name}_itl.png), [{name}_ttft.png]({name}_ttft.png), "
        f"[{name}_goodput.png]({name}_goodput.png).",
        "",
    ]
    for wl in meta["workloads"]:
        if any(r["workload"] == wl for r in rows):
            lines += table(meta, rows, wl)
    return "\n".join(lines)


def command(meta: dict[str, Any]) -> str:
    """The run's command line (older results recorded only whether it was --quick)."""
    return str(meta.get("command") or f"python -m bench.pd{' --quick' if meta['quick'] else ''}")


def plot(
    path: Path,
    meta: dict[str, Any],
    rows: list[dict[str, Any]],
    metric: str,
    names: list[str],
    title: str,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = [w for w in meta["workloads"] if any(r["workload"] == w for r in rows)]
    fig, axes = plt.subplots(1, len(workloads), figsize=(5 * len(workloads), 4), squeeze=False)
    for ax, wl in zip(axes[0], workloads, strict=True):
        for i, name in enumerate(names):
            pts = [
                (r["load"], r[metric])
                for r in rows
                if r["deployment"] == name and r["workload"] == wl and r[metric] is not None
            ]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", color=f"C{i}", label=name)
        ax.set_title(wl)
        ax.set_xlabel("load (offered / aggregated capacity)")
        ax.grid(True, alpha=0.3)
        if metric != "goodput":
            ax.set_yscale("log")
    axes[0][0].set_ylabel(title)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"{title} ({meta['name']}{', short run' if meta['quick'] else ''})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write(out: Path, name: str, meta: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_bytes(
        orjson.dumps({"meta": meta, "rows": rows}, option=orjson.OPT_INDENT_2) + b"\n"
    )
    (out / f"{name}.md").write_text(markdown(meta, rows))
    layouts = ["aggregated", *split_names(meta)]
    plot(out / f"{name}_itl.png", meta, rows, "itl_p99_ms", layouts, "ITL p99 (ms)")
    plot(out / f"{name}_ttft.png", meta, rows, "ttft_p90_ms", layouts, "TTFT p90 (ms)")
    deciders = list(decider_names(meta).values())
    plot(out / f"{name}_goodput.png", meta, rows, "goodput", ["aggregated", *deciders], "goodput")
