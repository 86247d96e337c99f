"""One scenario end to end: deploy its shape, drive its workload while its fault
schedule runs, quiesce, scrape, probe recovery; the recorded Run goes to the
invariant checks."""

from __future__ import annotations

import time
from pathlib import Path

import orjson

from tests.scenarios.deploy import Deployment, Server, deployed
from tests.scenarios.drive import Driver, send
from tests.scenarios.faults import apply
from tests.scenarios.generate import requests
from tests.scenarios.invariants import RECOVERY_REQUESTS, SERVER_DEATHS
from tests.scenarios.model import BASE_MODEL, FaultEvent, Outcome, RequestSpec, Run, Scenario
from tests.support.http import get_json, metric_samples

QUIESCE_S = 30.0  # a wide safety net: rest normally comes within a second
REJOIN_S = 60.0  # a restarted server starts, passes the readiness check, is scraped
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


def _healthy(d: Deployment, server: Server) -> bool:
    try:
        samples = metric_samples(f"{d.epp_http_urls()[0]}/metrics")
    except OSError:
        return False
    return any(
        k.startswith("epp_endpoint_status{") and f'"{server.address}"' in k
        and 'status="healthy"' in k and v == 1
        for k, v in samples.items()
    )  # fmt: skip


def recover(s: Scenario, d: Deployment, events: list[FaultEvent]) -> tuple[list[Outcome], str]:
    """I6's probe: once the victim is healthy again in the EPP's view, short requests one
    at a time until it serves one."""
    if s.fault.kind not in SERVER_VICTIMS or not events:
        return [], ""
    victim = next(srv for srv in d.servers() if srv.address == events[0].victim)
    deadline = time.monotonic() + REJOIN_S
    while not _healthy(d, victim):
        if time.monotonic() > deadline:
            return [], f"{victim.name} not healthy in the EPP's view {REJOIN_S:g}s after"
        time.sleep(0.1)
    outcomes = []
    for i in range(RECOVERY_REQUESTS):
        body = {"model": BASE_MODEL, "prompt": f"recovery {s.seed} {i}", "max_tokens": 2}
        spec = RequestSpec(10_000 + i, orjson.dumps(body), BASE_MODEL, False, False)
        outcomes.append(send(d.url, spec))
        if not outcomes[-1].complete:
            return outcomes, f"a recovery request failed: {outcomes[-1]}"
        if outcomes[-1].served == victim.address:
            return outcomes, ""
    return outcomes, f"{victim.name} served none of {RECOVERY_REQUESTS} requests after healing"


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


def run_seed(s: Scenario, tmp: Path) -> Run:
    with deployed(s.shape, tmp) as d:
        return run_scenario(s, d)
