"""One scenario end to end: deploy its shape, drive its workload while its fault
schedule runs, quiesce, scrape, probe recovery; the recorded Run goes to the
invariant checks."""

from __future__ import annotations

import time
from pathlib import Path

import orjson

from tests.scenarios.deploy import Deployment, Server, deployed
from tests.scenarios.drive import Driver
from tests.scenarios.eppfrom import OtherCheckout
from tests.scenarios.faults import apply
from tests.scenarios.generate import requests
from tests.scenarios.invariants import RECOVERY_REQUESTS, SERVER_DEATHS
from tests.scenarios.model import (
    BASE_MODEL,
    FaultEvent,
    Outcome,
    RequestSpec,
    Run,
    Scenario,
    stream_first_byte_s,
)
from tests.support.http import get_json, metric_samples

QUIESCE_S = 30.0  # a wide safety net: rest normally comes within a second
REJOIN_S = 60.0  # a restarted server starts, passes the readiness check, is scraped
BURST = 4  # I6's probe: concurrent requests, so an idle favourite cannot take them all
STALE_AFTER_S = 2.0  # dataLayer.staleAfterSeconds, the default
SERVER_VICTIMS = (*SERVER_DEATHS, "fault-status", "metrics-fault")


def _scrape(d: Deployment) -> list[dict[str, float]]:
    return [metric_samples(f"{url}/metrics") for url in d.epp_http_urls()]


def _busy(d: Deployment) -> str:
    """What is not at rest yet ("" when all is): in-flight counts and pending decodes on
    every EPP, running and waiting requests on every server."""
    busy = []
    try:
        for i, samples in enumerate(_scrape(d)):
            for key, value in samples.items():
                name = key.split("{")[0]
                if name in ("epp_in_flight_requests", "epp_pending_decode_requests") and value:
                    busy.append(f"EPP {i} {key} = {value:g}")
    except OSError as exc:
        return f"an EPP does not answer /metrics: {exc}"
    for server in d.servers():
        try:
            stats = get_json(f"http://{server.address}/sim/stats")
        except (OSError, AssertionError) as exc:
            busy.append(f"{server.name} does not answer /sim/stats: {exc}")
            continue
        if stats["running"] or stats["waiting"]:
            busy.append(f"{server.name} running {stats['running']} waiting {stats['waiting']}")
    return "; ".join(busy)


def quiesce(d: Deployment) -> str:
    """Wait for rest; what was still busy at the deadline, or "" once at rest."""
    deadline = time.monotonic() + QUIESCE_S
    while busy := _busy(d):
        if time.monotonic() > deadline:
            return f"not at rest after {QUIESCE_S:g}s: {busy}"
        time.sleep(0.05)
    return ""


def _rejoined(d: Deployment, server: Server) -> bool:
    """Whether the EPP has ``server`` healthy and its load fresh: a load older than
    staleAfterSeconds (2 s by default; a slow /metrics leaves it so for a while after
    it heals) counts as unknown, which the load scorers rate lowest (docs/timeouts.md)."""
    try:
        samples = metric_samples(f"{d.epp_http_urls()[0]}/metrics")
    except OSError:
        return False
    mine = {k.split("{")[0]: v for k, v in samples.items() if f'"{server.address}"' in k
            and (not k.startswith("epp_endpoint_status{") or 'status="healthy"' in k)}  # fmt: skip
    return (
        mine.get("epp_endpoint_status") == 1
        and mine.get("epp_endpoint_metrics_age_seconds", STALE_AFTER_S) < STALE_AFTER_S
    )


def recover(s: Scenario, d: Deployment, events: list[FaultEvent]) -> tuple[list[Outcome], str]:
    """I6's probe: once the victim is healthy again in the EPP's view with a fresh load,
    bursts of BURST concurrent short requests until it serves one."""
    if s.fault.kind not in SERVER_VICTIMS or not events:
        return [], ""
    victim = next(srv for srv in d.servers() if srv.address == events[0].victim)
    deadline = time.monotonic() + REJOIN_S
    while not _rejoined(d, victim):
        if time.monotonic() > deadline:
            return [], f"{victim.name} not healthy and fresh in the EPP's view {REJOIN_S:g}s after"
        time.sleep(0.1)
    outcomes: list[Outcome] = []
    while len(outcomes) < RECOVERY_REQUESTS:
        with Driver(d.url, [_probe(s, len(outcomes) + k) for k in range(BURST)], BURST) as burst:
            pass
        outcomes += burst.outcomes
        failed = [o for o in burst.outcomes if not o.complete]
        if failed:
            return outcomes, f"a recovery request failed: {failed[0]}"
        if any(o.served == victim.address for o in burst.outcomes):
            return outcomes, ""
    return outcomes, f"{victim.name} served none of {RECOVERY_REQUESTS} requests after healing"


def _probe(s: Scenario, i: int) -> RequestSpec:
    body = {"model": BASE_MODEL, "prompt": f"recovery {s.seed} {i}", "max_tokens": 8}
    return RequestSpec(10_000 + i, orjson.dumps(body), BASE_MODEL, False, False)


def run_scenario(s: Scenario, d: Deployment) -> Run:
    """Drive ``s`` on a deployment of its shape and record everything."""
    servers = d.servers()
    before = _scrape(d)
    with Driver(d.url, requests(s), s.workload.clients) as driver:
        events = apply(s, d, driver)
    run = Run(
        scenario=s,
        outcomes=driver.outcomes,
        events=events,
        serves={srv.address: set(srv.serves) for srv in servers},
        servers_that_decode=[srv.address for srv in servers if srv.decodes],
        epp_before=before,
        epp_restarted=s.fault.kind == "epp-replica-kill",
    )
    run.quiesce_error = quiesce(d)
    run.epp_after = _scrape(d) if not run.quiesce_error else []
    run.recovery, run.recovery_error = recover(s, d, events)
    return run


def run_seed(s: Scenario, tmp: Path, epp_from: OtherCheckout | None = None) -> Run:
    """``s`` on a fresh deployment of its shape (with ``epp_from``: another checkout's
    EPP, eppfrom.py)."""
    first_byte = stream_first_byte_s(s.fault.kind)
    with deployed(s.shape, tmp, stream_first_byte_s=first_byte, epp_from=epp_from) as d:
        return run_scenario(s, d)
