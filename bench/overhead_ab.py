"""bench.overhead's pure parts for A/B runs and repeats: which flags another checkout's
``epp serve`` takes, the median of repeated cells, the new/old CPU ratios, and the CPU
each streamed response chunk costs."""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable, Sequence
from typing import Any

# `epp serve` flags the harness may leave out where a checkout's CLI lacks them: the
# process then serves as that version did (e.g. gRPC health on the ext_proc port
# instead of a port of its own). Any other missing flag or choice means the path
# cannot run on that checkout.
OPTIONAL_FLAGS = frozenset({"--grpc-health-port"})
_OPTION = re.compile(r"(?<![\w-])(--[a-z0-9][a-z0-9-]*)(?:[ =]\{([^}]*)\})?")


def cli_options(help_text: str) -> dict[str, frozenset[str] | None]:
    """The options an argparse ``--help`` lists, each with its choices (None: any
    value, or none)."""
    found: dict[str, frozenset[str] | None] = {}
    for flag, choices in _OPTION.findall(help_text):
        if choices:
            found[flag] = frozenset(c.strip() for c in choices.split(","))
        else:
            found.setdefault(flag, None)
    return found


def _split(argv: Sequence[str]) -> list[list[str]]:
    """``argv`` (flags only) as [flag, values...] groups."""
    groups: list[list[str]] = []
    for arg in argv:
        if arg.startswith("--") or not groups:
            groups.append([arg])
        else:
            groups[-1].append(arg)
    return groups


def adapt_argv(
    argv: Sequence[str], options: dict[str, frozenset[str] | None]
) -> tuple[list[str] | None, str]:
    """``argv`` as a CLI with ``options`` (:func:`cli_options`) takes it: optional flags
    it lacks left out; (None, why) when a needed flag or value is missing. The second
    item names what was left out ("" when nothing)."""
    kept: list[str] = []
    dropped: list[str] = []
    for flag, *values in _split(argv):
        if flag not in options:
            if flag in OPTIONAL_FLAGS:
                dropped.append(flag)
                continue
            return None, f"its CLI has no {flag}"
        choices = options[flag]
        if choices is not None and values and values[0] not in choices:
            return None, f"its {flag} takes {', '.join(sorted(choices))}, not {values[0]}"
        kept += [flag, *values]
    return kept, ("left out " + ", ".join(dropped)) if dropped else ""


# what a row is, not what it measured: the same in every repeat of its cell
_IDENTITY = frozenset({"concurrency", "server_ms", "stream_chunks", "workers"})


def _cell(row: dict[str, Any]) -> tuple[float, int, int]:
    return (float(row.get("server_ms", 0.0)), int(row.get("stream_chunks", 0)), row["concurrency"])


def median_rows(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (cell, path), each number the median over the repeats (so a row's
    figures may come from different repeats); first-seen order."""
    groups: dict[tuple[tuple[float, int, int], str], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((_cell(r), r["path"]), []).append(r)
    out = []
    for runs in groups.values():
        merged = dict(runs[0])
        merged.pop("repeat", None)
        for key, value in merged.items():
            if isinstance(value, bool) or key in _IDENTITY:
                continue
            if isinstance(value, int | float):
                merged[key] = statistics.median(float(r[key]) for r in runs if key in r)
            elif isinstance(value, list) and all(isinstance(v, int | float) for v in value):
                # element by element (each worker's figures), over the runs that have them
                lists = [r[key] for r in runs if len(r.get(key, ())) == len(value)]
                merged[key] = [
                    statistics.median(float(x) for x in xs) for xs in zip(*lists, strict=True)
                ]
        merged["repeats"] = len(runs)
        out.append(merged)
    return out


def cpu_ratios(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per cell and path run on both sides: the median over the repeats of new EPP CPU
    per request / old, each repeat's pair set against each other (rows need ``key``:
    the path, ``side``: "new" or "old", ``repeat``)."""
    pairs: dict[tuple[tuple[float, int, int], str], dict[int, dict[str, float]]] = {}
    for r in rows:
        if "side" not in r or "epp_cpu_us_per_req" not in r:
            continue
        by_repeat = pairs.setdefault((_cell(r), r["key"]), {})
        by_repeat.setdefault(r["repeat"], {})[r["side"]] = float(r["epp_cpu_us_per_req"])
    out = []
    for ((server_ms, chunks, c), key), by_repeat in pairs.items():
        ratios = [p["new"] / p["old"] for p in by_repeat.values() if {"new", "old"} <= p.keys()]
        if not ratios:
            continue
        out.append(
            {
                "key": key,
                "server_ms": server_ms,
                "stream_chunks": chunks,
                "concurrency": c,
                "ratio": statistics.median(ratios),
                "ratios": ratios,
            }
        )
    return out


def request_cpu_us(row: dict[str, Any]) -> float:
    """The EPP's CPU per request less its idle work over the same time (where measured:
    ``epp_idle_cpu_us_per_s``)."""
    idle = float(row.get("epp_idle_cpu_us_per_s", 0.0))
    return float(row["epp_cpu_us_per_req"]) - (idle / row["rps"] if row.get("rps") else 0.0)


def per_chunk_us(plain: dict[str, Any], streamed: dict[str, Any]) -> float | None:
    """EPP CPU per streamed response chunk: what a streamed request costs more than the
    same request answered in one piece (each less the EPP's idle work), over the
    ext_proc messages Envoy sent more (its own counters: the chunks that reached the EPP
    one by one), or over the chunks the server wrote when the counters are missing.
    None without a difference."""
    extra_us = request_cpu_us(streamed) - request_cpu_us(plain)
    messages = streamed.get("extproc_msgs_per_req")
    before = plain.get("extproc_msgs_per_req")
    if messages is not None and before is not None:
        extra = float(messages) - float(before)
    else:
        extra = float(streamed["stream_chunks"])
    return extra_us / extra if extra > 0 else None
