"""ORCA load reports reach the EPP's endpoint state: from response headers (through
Envoy) and from the out-of-band OpenRcaService stream."""

from __future__ import annotations

import socket
from pathlib import Path

import orjson
import pytest

from epp_harness.stack import LocalStack
from tests.e2e.conftest import ephemeral
from tests.support.http import metric_sum, request
from tests.support.wait import wait_for

pytestmark = pytest.mark.e2e


def epp_metric(stack: LocalStack, name: str, label: str = "") -> float:
    _, _, text = request(f"{stack.epp_http_url}/metrics")
    lines = [ln for ln in text.decode().splitlines() if label in ln]
    return metric_sum("\n".join(lines), name)


def test_orca_response_headers_update_endpoint_load(tmp_path: Path) -> None:
    config = tmp_path / "epp.yaml"  # no scraping: ORCA headers are the only load signal
    config.write_text("dataLayer: {scrapeMetrics: false, orca: {requestFormat: TEXT}}\n")
    opts = ephemeral(servers=1, sim_args=["--time-scale", "0"], epp_args=["--config", str(config)])
    with LocalStack(opts) as stack:
        body = orjson.dumps({"model": "sim-model", "prompt": "hello", "max_tokens": 2})
        status, headers, _ = request(f"{stack.envoy_url}/v1/completions", body)
        assert status == 200
        assert headers["endpoint-load-metrics"].startswith("TEXT ")  # the EPP asked for it
        wait_for(lambda: epp_metric(stack, "epp_orca_reports_total", 'result="ok"') >= 1)
        assert epp_metric(stack, "epp_orca_reports_total", 'result="malformed"') == 0
        # the report set the endpoint's KV use and queue, which the scheduler reads
        assert (
            "epp_endpoint_kv_cache_usage{" in request(f"{stack.epp_http_url}/metrics")[2].decode()
        )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_orca_out_of_band_stream_updates_endpoint_load(tmp_path: Path) -> None:
    port = free_port()  # oobPort is one port for every endpoint host
    config = tmp_path / "epp.yaml"
    config.write_text(
        "dataLayer: {scrapeMetrics: false, "
        f"orca: {{oobPort: {port}, reportIntervalSeconds: 0.05}}}}\n"
    )
    opts = ephemeral(
        servers=1,
        sim_args=["--time-scale", "0", "--orca-port", str(port)],
        epp_args=["--config", str(config)],
    )
    with LocalStack(opts) as stack:
        wait_for(lambda: epp_metric(stack, "epp_orca_reports_total", 'source="oob"') >= 2)
        text = request(f"{stack.epp_http_url}/metrics")[2].decode()
        assert "epp_endpoint_queue_depth{" in text
