"""A real ``epp serve --config FILE`` follows FILE: a rewritten file changes routing
(polled), so does SIGHUP, and a broken file leaves the running config serving."""

from __future__ import annotations

import signal
from pathlib import Path

import grpc
import orjson
from envoy.service.ext_proc.v3.external_processor_pb2_grpc import ExternalProcessorStub

from epp_harness.procs import ManagedProcess, start_epp
from tests.support import extproc as m
from tests.support.http import metric_samples
from tests.support.wait import wait_for

BODY = orjson.dumps({"model": "m", "prompt": "route me somewhere " * 10})


def zone_config(addresses: list[str], zone: str) -> str:
    """Two endpoints, zones a and b; route only to ``zone``."""
    a, b = addresses
    return (
        "plugins:\n"
        f"- {{type: label-selector-filter, parameters: {{matchLabels: {{zone: {zone}}}}}}}\n"
        "- {type: random-picker}\n"
        "dataLayer: {scrapeMetrics: false}\n"
        "endpoints:\n"
        f"- {{address: '{a}', labels: {{zone: a}}}}\n"
        f"- {{address: '{b}', labels: {{zone: b}}}}\n"
    )


def routed_to(proc: ManagedProcess) -> str:
    with grpc.insecure_channel(f"127.0.0.1:{proc.info['grpc_port']}") as channel:
        stub = ExternalProcessorStub(channel)
        messages = [m.request_headers(), m.request_body(BODY, True)]
        replies = list(stub.Process(iter(messages), timeout=10))
    return m.set_headers(replies[0])["x-gateway-destination-endpoint"]


def reloads(proc: ManagedProcess, result: str) -> float:
    samples = metric_samples(f"http://127.0.0.1:{proc.info['http_port']}/metrics")
    return samples.get(f'epp_config_reloads_total{{result="{result}"}}', 0.0)


def start(tmp_path: Path, config: Path, poll_s: str) -> ManagedProcess:
    return start_epp(
        tmp_path, "epp", "serve", "--grpc-port", "0", "--http-port", "0", "--grpc-health-port", "0",
        "--config", str(config), "--config-poll-seconds", poll_s,
        "--eject-after", "0",  # nothing listens at the endpoints
    )  # fmt: skip


def test_a_rewritten_file_takes_effect_and_a_broken_one_is_refused(
    tmp_path: Path, closed_addresses: list[str]
) -> None:
    zone_a, zone_b = closed_addresses
    config = tmp_path / "epp.yaml"
    config.write_text(zone_config(closed_addresses, "a"))
    proc = start(tmp_path, config, "0.1")
    try:
        assert routed_to(proc) == zone_a
        config.write_text(zone_config(closed_addresses, "b"))
        wait_for(lambda: routed_to(proc) == zone_b, what="routing by the rewritten file")
        assert reloads(proc, "success") == 1

        config.write_text("plugins: [{type: no-such-plugin}]\n")
        wait_for(lambda: reloads(proc, "failure") == 1, what="the broken file refused")
        assert routed_to(proc) == zone_b and reloads(proc, "success") == 1

        # a change only a restart applies is refused whole, though the rest is valid
        restart = zone_config(closed_addresses, "a")
        config.write_text(restart.replace("scrapeMetrics: false", "scrapeMetrics: true"))
        wait_for(lambda: reloads(proc, "failure") == 2, what="the dataLayer change refused")
        assert routed_to(proc) == zone_b
    finally:
        proc.stop()
    log = (tmp_path / "epp.log").read_text()
    assert f"{config}: plugins[0].type: unknown plugin type 'no-such-plugin'" in log
    assert f"{config}: dataLayer changed, and only a restart applies that" in log
    assert log.count("the previous config still runs") == 2


def test_sighup_reloads_and_a_broken_file_keeps_serving(
    tmp_path: Path, closed_addresses: list[str]
) -> None:
    zone_a, zone_b = closed_addresses
    config = tmp_path / "epp.yaml"
    config.write_text(zone_config(closed_addresses, "a"))
    proc = start(tmp_path, config, "0")  # no polling: SIGHUP only
    assert proc.proc is not None
    try:
        config.write_text(zone_config(closed_addresses, "b"))
        assert routed_to(proc) == zone_a  # not polled
        proc.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: reloads(proc, "success") == 1, what="the SIGHUP reload")
        assert routed_to(proc) == zone_b

        config.write_text("plugins: [\n")
        proc.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: reloads(proc, "failure") == 1, what="the broken file refused")
        assert routed_to(proc) == zone_b
        assert proc.proc.poll() is None
    finally:
        proc.stop()
    assert "invalid YAML" in (tmp_path / "epp.log").read_text()
