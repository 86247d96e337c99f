"""bench.overhead's rows for ``epp serve --workers N``: the processes of one EPP group,
each worker's share of the streams, and what the measured CPU per request predicts for
machines with more cores; ``python -m bench.workers`` prints what one message of the
parent-worker link costs."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable
from typing import Any

import orjson
from prometheus_client.parser import text_string_to_metric_families

from epp.datastore import Datastore
from epp.types import Endpoint, EndpointMetrics
from epp.workers import wire
from epp.workers.replica import apply_members

PREDICT_CORES = (8, 16)


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as reply:
        body: bytes = reply.read()
        return body


def group(http_port: int) -> list[dict[str, Any]]:
    """The parent's ``/workers``: each worker's index, pid and ports."""
    listed: list[dict[str, Any]] = orjson.loads(_get(f"http://127.0.0.1:{http_port}/workers"))[
        "workers"
    ]
    return listed


def requests_seen(worker_http_port: int) -> float:
    """``epp_requests_total`` of one worker (every outcome)."""
    text = _get(f"http://127.0.0.1:{worker_http_port}/metrics").decode()
    return sum(
        s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "epp_requests_total"
    )


def shares(before: list[float], after: list[float]) -> list[float]:
    """Each worker's share of the requests between two readings."""
    done = [b - a for a, b in zip(before, after, strict=True)]
    total = sum(done) or 1.0
    return [d / total for d in done]


def predicted_rps(row: dict[str, Any], cores: int) -> tuple[float, float]:
    """(the EPP group alone on ``cores`` with one worker per core, the whole run's
    processes on ``cores``), both from the row's CPU per request, which is assumed to
    stay as measured: rps = cores / CPU seconds per request, and the parent (one
    process) caps the first at 1 / its own CPU per request."""
    epp_us = float(row["epp_cpu_us_per_req"])
    parent_us = float(row.get("epp_process_cpu_us_per_req", [epp_us])[0])
    alone = min(cores / epp_us, 1 / parent_us if parent_us > 0 else float("inf")) * 1e6
    everything = epp_us + sum(row[f"{k}_cpu_us_per_req"] for k in ("envoy", "sims", "client"))
    return alone, cores / everything * 1e6


def table(rows: list[dict[str, Any]]) -> list[str]:
    """The worker rows (concurrency 64, instant servers) side by side, with the
    prediction for larger machines."""
    picked = [r for r in rows if "workers" in r]
    if not picked:
        return []
    heads = " | ".join(
        f"predicted req/s on {c} cores (EPP alone / everything)" for c in PREDICT_CORES
    )
    lines = [
        "## Worker processes (`epp serve --workers N`)",
        "",
        "EPP CPU is every process of the group (the parent and each worker); *per process* "
        "lists them, parent first. The prediction divides the cores by the measured CPU "
        "per request: *EPP alone* gives the EPP group the whole machine (one worker per "
        "core, the parent capping it at one core's worth of its own work), *everything* "
        "puts Envoy, the servers and the clients on the same cores as here.",
        "",
        f"| path | concurrency | req/s | p50 ms | EPP CPU µs/req | per process µs/req "
        f"| each worker's share of streams | {heads} |",
        "|---|---:|---:|---:|---:|---|---|" + "---:|" * len(PREDICT_CORES),
    ]
    for r in picked:
        per_process = " / ".join(f"{v:.0f}" for v in r["epp_process_cpu_us_per_req"])
        share = " / ".join(f"{s:.0%}" for s in r["worker_shares"])
        predicted = " | ".join(
            "{:.0f} / {:.0f}".format(*predicted_rps(r, c)) for c in PREDICT_CORES
        )
        lines.append(
            f"| {r['path']} | {r['concurrency']} | {r['rps']:.0f} | {r['p50_ms']:.2f} "
            f"| {r['epp_cpu_us_per_req']:.0f} | {per_process} | {share} | {predicted} |"
        )
    lines.append("")
    return lines


def message_costs(sizes: tuple[int, ...] = (4, 100, 1000)) -> list[str]:
    """CPU per message of the parent-worker link: load reports (Loads) encoded,
    decoded and applied to a worker's datastore, one alone and every member's at once,
    and the whole membership (Members) for pools of each size."""
    return [_message_cost(size) for size in sizes]


def _per_call_us(fn: Callable[[], None], n: int) -> float:
    began = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - began) / n * 1e6


def _message_cost(size: int) -> str:
    parent, worker = Datastore(), Datastore()
    for i in range(size):
        parent.add(Endpoint(f"10.0.{i // 250}.{i % 250 + 1}", 8000))
    frame = wire.encode(wire.members(parent.version, parent.members()))

    def members() -> None:
        body = wire.encode(wire.members(parent.version, parent.members()))[wire.HEADER.size :]
        message = wire.decode(body)
        assert isinstance(message, wire.Members)
        apply_members(worker, message)

    report = EndpointMetrics(time.monotonic(), waiting=1.0, running=3.0, kv_usage=0.4)

    def loads(addresses: list[str]) -> Callable[[], None]:
        def send() -> None:
            sent = wire.Loads([wire.EndpointData(a, wire.wire_metrics(report)) for a in addresses])
            message = wire.decode(wire.encode(sent)[wire.HEADER.size :])
            assert isinstance(message, wire.Loads)
            for r in message.reports:
                worker.update_metrics(r.address, wire.metrics(r.metrics))

        return send

    members()  # the first apply adds every member; time the steady state
    every = [m.address for m in parent.members()]
    return (
        f"{size} endpoints: membership {len(frame):,} bytes, "
        f"{_per_call_us(members, max(20, 20_000 // size)):.0f} µs to encode, decode and "
        f"apply; one load report {_per_call_us(loads(every[:1]), 20_000):.1f} µs alone, "
        f"{_per_call_us(loads(every), max(20, 20_000 // size)) / size:.1f} µs each when "
        "every member's go together"
    )


if __name__ == "__main__":
    print("\n".join(message_costs()))
