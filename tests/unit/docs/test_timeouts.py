"""docs/timeouts.md quotes every timeout's value; each is set once in the code, and
this test fails when the page and the code disagree."""

from __future__ import annotations

import re
from pathlib import Path

from epp.cli import build_parser
from epp.datalayer import peerload
from epp.datalayer.settings import DataLayerConfig
from epp.disagg.settings import DisaggConfig
from epp.discovery.readiness import ReadinessProbe
from epp.flowcontrol.queues import FlowControlConfig
from epp.lifecycle import observers
from epp.observability import metrics
from epp.xds import eds
from epp_harness import stack, supervisor
from epp_harness.envoyconfig import EnvoyOptions, epp_config

DOC = Path(__file__).resolve().parents[3] / "docs" / "timeouts.md"


def doc_values() -> dict[str, str]:
    """First column -> value column of the table."""
    rows = {}
    for line in DOC.read_text().splitlines():
        line = line.removesuffix("<!-- not-a-result -->")  # tools/figures' marker
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[1] and cells[0] not in ("timeout", "---"):
            rows[cells[0]] = cells[1]
    return rows


def seconds(value: float) -> str:
    return f"{value:g} s"


def test_every_value_in_the_table_is_the_codes() -> None:
    serve = build_parser("serve").parse_args(["serve"])
    e = EnvoyOptions()
    expected = {
        "ext_proc message timeout": seconds(e.message_timeout_s),
        "ext_proc max message timeout": seconds(e.max_message_timeout_s),
        "after dispatch margin": seconds(FlowControlConfig().message_timeout_margin_s),
        "EPP unreachable or too slow": str(e.status_on_error),
        "prefill leg": seconds(DisaggConfig().prefill_timeout_s),
        "prefill connect": seconds(DisaggConfig().connect_timeout_s),
        "upstream connect": seconds(e.connect_timeout_s),
        "per-try idle, non-streaming": seconds(e.first_byte_timeout_s),
        "per-try idle, streaming": seconds(e.stream_idle_timeout_s),
        "stream chunk timeout": seconds(serve.stream_chunk_timeout),
        "retries": str(e.destinations),
        "route timeout": seconds(e.route_timeout_s),
        "ext_proc graceful close": "1 s",
        "EDS reconnect": f"{e.eds_retry_base_s:g} s → {e.eds_retry_max_s:g} s",
        "EDS acknowledgement wait": seconds(eds.EDS_SYNC_WAIT_S),
        "EDS settle": seconds(observers.EDS_SETTLE_S),
        "scrape": seconds(DataLayerConfig().scrape_timeout_s),
        "metrics stale after": seconds(DataLayerConfig().stale_after_s),
        "readiness check": seconds(ReadinessProbe().timeout_s),
        "peer load expiry": seconds(peerload.EXPIRE_S),
        "drain": seconds(serve.drain_timeout_seconds),
        "EPP shutdown grace": seconds(serve.shutdown_grace_seconds),
        "endpoint series after removal": seconds(metrics.SERIES_GRACE_S),
        "`epp stack` restart backoff": (
            f"{supervisor.RESTART_BACKOFF_S:g} s → {supervisor.MAX_RESTART_BACKOFF_S:g} s"
        ),
        "flow-control queue wait": seconds(FlowControlConfig().queue_timeout_s),
    }
    assert doc_values() == expected


def test_the_nesting_holds_for_the_defaults() -> None:
    e = EnvoyOptions()
    # the EPP ends a stalled stream before Envoy would cut it; the first byte gets more
    serve = build_parser("serve").parse_args(["serve"])
    assert 0 < serve.stream_chunk_timeout <= 15 < e.stream_idle_timeout_s
    assert stack.StackOptions().stream_chunk_timeout_s == serve.stream_chunk_timeout
    flow = FlowControlConfig()
    # the EPP extends Envoy's wait by the margin for a prefill leg, and by the queue
    # limit + the margin for a held request, within what Envoy honours
    assert DisaggConfig().prefill_timeout_s < flow.message_timeout_margin_s
    assert flow.queue_timeout_s <= flow.max_queue_timeout_s
    longest = eds.EDS_SYNC_WAIT_S + flow.max_queue_timeout_s + flow.message_timeout_margin_s
    assert longest <= e.max_message_timeout_s
    # the first EDS acknowledgement comes after one reconnect, well within the wait
    assert e.eds_retry_max_s < eds.EDS_SYNC_WAIT_S < e.message_timeout_s
    assert e.stream_idle_timeout_s <= e.first_byte_timeout_s < e.route_timeout_s
    # a scrape may outlast staleAfterSeconds (a busy engine answers /metrics slowly);
    # what must hold is that the interval stretch leaves room for a failed scrape
    d = DataLayerConfig()
    assert d.scrape_interval_s < d.stale_after_s / 2
    # the drawing's numbers are the table's
    drawing = DOC.read_text().split("```")[1]
    for value in (e.route_timeout_s, e.message_timeout_s, e.first_byte_timeout_s):
        assert re.search(rf"\b{value:g} s\b", drawing)


def test_the_generated_route_carries_the_per_try_idle_timeouts() -> None:
    config = epp_config(EnvoyOptions())
    hcm = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    routes = hcm["typed_config"]["route_config"]["virtual_hosts"][0]["routes"]
    idle = [r["route"]["retry_policy"]["per_try_idle_timeout"] for r in routes]
    e = EnvoyOptions()
    # streaming, then the rest; each with a LoRA adapter's 404 retried, then without
    stream, first_byte = f"{e.stream_idle_timeout_s:g}s", f"{e.first_byte_timeout_s:g}s"
    assert idle == [stream, stream, first_byte, first_byte]
    assert {r["route"]["timeout"] for r in routes} == {f"{e.route_timeout_s:g}s"}
