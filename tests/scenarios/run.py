"""One scenario end to end: deploy its shape, drive its workload while its fault
schedule runs, quiesce, scrape, probe recovery; the recorded Run goes to the
invariant checks."""

from __future__ import annotations

import os
import time
from pathlib import Path

import orjson

from tests.scenarios.deploy import Deployment, Server, deployed, lora_holders
from tests.scenarios.drive import Driver, send
from tests.scenarios.eppfrom import OtherCheckout
from tests.scenarios.faults import apply
from tests.scenarios.generate import SESSIONS, conversation, requests
from tests.scenarios.invariants import (
    CONVERSATION_TURNS,
    EPP_DEATHS,
    FLOW_QUEUE,
    RECOVERY_REQUESTS,
    SERVER_DEATHS,
    UNSETTLED,
)
from tests.scenarios.model import (
    BASE_MODEL,
    CHAT_PATH,
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
SERVER_VICTIMS = (*SERVER_DEATHS, "fault-status", "metrics-fault", "admin-remove-add")
# the EPP's work still open: in-flight counts, pending decodes, flow-control queues
OPEN = ("epp_in_flight_requests", "epp_pending_decode_requests", FLOW_QUEUE)
# I3's sockets: what the EPP may hold after the load beyond what it held before it
# (connections opened on demand and kept alive: one from each Envoy worker thread, one
# pool connection per concurrent client to a server or the EPP's own peers); a socket
# leaked per request or per failure outgrows it
SOCKETS_WAIT_S = 20.0  # idle keep-alive connections close within this (a safety net)
KV_BLOCKS = "epp_kv_index_blocks"  # kv-events' I6: the EPP hears the victim again
KV_HEARD_S = 10.0  # events arrive within moments (a safety net)
# Envoy's retries of ext_proc streams on another EPP (I5): cluster epp's upstream_rq_retry
EPP_RETRIES = 'envoy_cluster_upstream_rq_retry{envoy_cluster_name="epp"}'


def _scrape(d: Deployment) -> list[dict[str, float]]:
    return [
        {**metric_samples(f"{url}/metrics"), **metric_samples(f"{url}/metrics", FLOW_QUEUE)}
        for url in d.epp_http_urls()
    ]


def epp_stream_retries(d: Deployment) -> float:
    """How many ext_proc streams Envoy has opened again on another EPP (0 before any,
    where its admin is not known, and where it is gone: a stack that stopped, which the
    other invariants report)."""
    admin = d.envoy_admin_url()
    if not admin:
        return 0.0
    try:
        samples = metric_samples(f"{admin}/stats/prometheus", EPP_RETRIES.split("{")[0])
    except OSError:
        return 0.0
    assert EPP_RETRIES in samples, f"Envoy's stats have no {EPP_RETRIES}: {samples}"
    return samples[EPP_RETRIES]


def _sockets(pid: int) -> int:
    """Open sockets of process ``pid`` (its /proc fd table); 0 once it is gone."""
    count = 0
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return 0
    for fd in fds:
        try:
            count += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
        except OSError:
            continue  # closed meanwhile
    return count


def epp_sockets(d: Deployment) -> dict[int, int]:
    """Every EPP process's open sockets, by pid."""
    return {pid: _sockets(pid) for pid in d.epp_pids()}


def sockets_back(d: Deployment, before: dict[int, int], slack: int) -> str:
    """Wait until every EPP process that lived through the load holds at most ``slack``
    sockets more than before it; what it still held at the deadline, or ""."""
    deadline = time.monotonic() + SOCKETS_WAIT_S
    while True:
        now = epp_sockets(d)
        over = {pid: (before[pid], n) for pid, n in now.items()
                if pid in before and n > before[pid] + slack}  # fmt: skip
        if not over:
            return ""
        if time.monotonic() > deadline:
            said = ", ".join(f"pid {pid}: {was} -> {n}" for pid, (was, n) in over.items())
            return f"EPP sockets above their baseline + {slack} after {SOCKETS_WAIT_S:g}s: {said}"
        time.sleep(0.1)


def _busy(d: Deployment) -> str:
    """What is not at rest yet ("" when all is): in-flight counts and pending decodes on
    every EPP, running and waiting requests on every server."""
    busy = []
    try:
        for i, samples in enumerate(_scrape(d)):
            for key, value in samples.items():
                name = key.split("{")[0]
                if name in OPEN and value:
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
    mine = {k.split("{")[0]: v for k, v in samples.items() if f'"{server.in_epp}"' in k
            and (not k.startswith("epp_endpoint_status{") or 'status="healthy"' in k)}  # fmt: skip
    return (
        mine.get("epp_endpoint_status") == 1
        and mine.get("epp_endpoint_metrics_age_seconds", STALE_AFTER_S) < STALE_AFTER_S
    )


def recover(s: Scenario, d: Deployment, events: list[FaultEvent]) -> tuple[list[Outcome], str]:
    """I6's probe: once the victim is healthy again in the EPP's view with a fresh load,
    bursts of BURST concurrent short requests until it serves one. After an Envoy
    restart: one burst, every request of it answered."""
    if s.fault.kind == "envoy-restart" and events:  # the listener is back: one burst
        with Driver(d.url, [_probe(s, k) for k in range(BURST)], BURST) as burst:
            pass
        failed = [o for o in burst.outcomes if not o.complete]
        return (
            burst.outcomes,
            f"a request after Envoy's restart failed: {failed[0]}" if failed else "",
        )
    if not events or s.fault.kind not in SERVER_VICTIMS:
        return [], ""
    back = events[0].rejoin or events[0].victim
    victim = next(srv for srv in d.servers() if srv.address == back)
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
            return outcomes, _heard(d, victim) if s.shape == "kv-events" else ""
    return outcomes, f"{victim.name} served none of {RECOVERY_REQUESTS} requests after healing"


def _heard(d: Deployment, server: Server) -> str:
    """kv-events: whether every EPP's precise index holds blocks of ``server`` again,
    from its KV events after it served ("" once it does)."""
    where = f'endpoint="{server.in_epp}"'

    def blocks() -> float:
        return min(
            sum(v for k, v in metric_samples(f"{url}/metrics", KV_BLOCKS).items() if where in k)
            for url in d.epp_http_urls()
        )

    deadline = time.monotonic() + KV_HEARD_S
    while blocks() <= 0:
        if time.monotonic() > deadline:
            return (
                f"the EPP's index holds no block of {server.name} {KV_HEARD_S:g}s after it served"
            )
        time.sleep(0.1)
    return ""


def settle(s: Scenario, d: Deployment) -> list[Outcome]:
    """I6's placement: once the pool has recovered, a new conversation sent a turn at a
    time (judged by invariants.i6_not_recovered); nothing where the shape is UNSETTLED."""
    outcomes: list[Outcome] = []
    if s.shape in UNSETTLED:
        return outcomes
    for turn in range(CONVERSATION_TURNS):
        body = {"model": BASE_MODEL, "messages": conversation(s.seed, SESSIONS, turn),
                "max_tokens": 4}  # fmt: skip
        spec = RequestSpec(20_000 + turn, orjson.dumps(body), BASE_MODEL, False, False,
                           path=CHAT_PATH, session=SESSIONS)  # fmt: skip
        outcomes.append(send(d.url, spec))
        if not outcomes[-1].complete:
            break
    return outcomes


def _probe(s: Scenario, i: int) -> RequestSpec:
    # long enough for whole KV blocks (16 tokens of about a byte): kv-events' check
    prompt = f"recovery {s.seed} {i}: " + "a probe of the pool after the fault. " * 6
    body = {"model": BASE_MODEL, "prompt": prompt, "max_tokens": 8}
    return RequestSpec(10_000 + i, orjson.dumps(body), BASE_MODEL, False, False)


def run_scenario(s: Scenario, d: Deployment) -> Run:
    """Drive ``s`` on a deployment of its shape and record everything."""
    servers = d.servers()
    before, sockets, retries = _scrape(d), epp_sockets(d), epp_stream_retries(d)
    w = s.workload
    with Driver(d.url, requests(s), w.clients, (w.burst, w.burst_at)) as driver:
        events = apply(s, d, driver)
    servers += [srv for srv in d.servers() if srv not in servers]  # one that replaced another
    run = Run(
        scenario=s,
        outcomes=driver.outcomes,
        events=events,
        serves={srv.address: set(srv.serves) for srv in servers},
        servers_that_decode=[srv.address for srv in servers if srv.decodes],
        epp_before=before,
        epp_restarted=s.fault.kind in EPP_DEATHS,
    )
    run.quiesce_error = quiesce(d)
    run.epp_after = _scrape(d) if not run.quiesce_error else []
    # a restarted Envoy counts from 0 again
    restarted = s.fault.kind == "envoy-restart"
    run.epp_stream_retries = epp_stream_retries(d) - (0.0 if restarted else retries)
    if not run.quiesce_error:
        slack = (os.cpu_count() or 1) + s.workload.clients + len(servers)
        run.sockets_error = sockets_back(d, sockets, slack)
    run.recovery, run.recovery_error = recover(s, d, events)
    if not run.recovery_error:
        run.placement = settle(s, d)
    return run


def run_seed(s: Scenario, tmp: Path, epp_from: OtherCheckout | None = None) -> Run:
    """``s`` on a fresh deployment of its shape (with ``epp_from``: another checkout's
    EPP, eppfrom.py)."""
    first_byte = stream_first_byte_s(s.fault.kind)
    holders = lora_holders(s.fault.kind)
    with deployed(
        s.shape, tmp, stream_first_byte_s=first_byte, epp_from=epp_from, holders=holders
    ) as d:
        return run_scenario(s, d)
