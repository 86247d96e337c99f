"""Config reload: the whole file is validated and built before the router switches; on
any error the running config stays; learned state survives where the spec did not
change. Real router, datastore, metrics and files; no fakes."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import pytest

from epp import config
from epp.common.params import ConfigError
from epp.datastore import Datastore
from epp.disagg.settings import DisaggConfig
from epp.observability.metrics import EppMetrics
from epp.scheduling.latency import LatencyPriors
from epp.scheduling.plugins.prefix import PrefixCacheScorer
from epp.scheduling.scheduler import ProfileScheduler
from epp.serving.reload import ConfigFile, ConfigReloader
from epp.types import Endpoint, InferenceRequest
from tests.support.routers import make_router

ZONE_A = Endpoint("10.0.0.1", 8000, labels={"zone": "a"})
ZONE_B = Endpoint("10.0.0.2", 8000, labels={"zone": "b"})


def zone_config(zone: str, extra: str = "", scorer: str = "prefix-cache-scorer") -> str:
    """Route to the endpoint labelled ``zone``; a single default profile."""
    return (
        "plugins:\n"
        "- type: label-selector-filter\n"
        "  name: zone\n"
        f"  parameters: {{matchLabels: {{zone: {zone}}}}}\n"
        f"- {{type: {scorer}}}\n"
        "- {type: max-score-picker}\n" + extra
    )


class Setup:
    def __init__(self, path: Path, text: str) -> None:
        path.write_text(text)
        self.path = path
        self.datastore = Datastore()
        for endpoint in (ZONE_A, ZONE_B):
            self.datastore.add(endpoint)
        self.metrics = EppMetrics(self.datastore)
        self.file = ConfigFile(path)
        cfg = self.file.load()
        scheduler = config.instantiate(cfg, config.builtin_registry())
        self.router = make_router(self.datastore, scheduler, self.metrics)
        self.reloader = ConfigReloader(
            self.file, cfg, scheduler, self.router, self.metrics.config_reloads, poll_s=0
        )

    def routed_to(self) -> str:
        request = InferenceRequest("r", "m", "/v1/completions", prompt="hello " * 40)
        routed = self.router.route(request)
        routed.ticket.release()
        return routed.result.primary.address

    def count(self, result: str) -> float:
        value = self.metrics.registry.get_sample_value(
            "epp_config_reloads_total", {"result": result}
        )
        return value or 0.0

    @property
    def scheduler(self) -> ProfileScheduler:
        assert isinstance(self.router.scheduler, ProfileScheduler)
        return self.router.scheduler


@pytest.fixture
def setup(tmp_path: Path) -> Setup:
    return Setup(tmp_path / "epp.yaml", zone_config("a"))


def test_a_valid_file_switches_the_router_and_keeps_unchanged_plugins(setup: Setup) -> None:
    assert setup.routed_to() == ZONE_A.address
    before = setup.scheduler
    setup.path.write_text(zone_config("b"))
    assert setup.reloader.reload("test")
    assert setup.routed_to() == ZONE_B.address
    after = setup.scheduler
    assert after is not before and setup.reloader.scheduler is after
    # the prefix index (what it learned) survives; the changed filter is new
    assert after.plugins["prefix-cache-scorer"] is before.plugins["prefix-cache-scorer"]
    assert after.plugins["zone"] is not before.plugins["zone"]
    assert after.latency is before.latency
    # the watched InferenceObjectives' priorities: the very mapping discovery keeps
    assert after.objectives is before.objectives
    assert (setup.count("success"), setup.count("failure")) == (1, 0)


def test_models_are_applied_on_reload(setup: Setup) -> None:
    assert setup.router.models.rewrites == {}
    setup.path.write_text(zone_config("a", "models: {rewrites: {m: {m-v2: 1}}}\n"))
    assert setup.reloader.reload("test")
    assert setup.router.models.rewrites == {"m": {"m-v2": 1}}


def test_the_served_endpoint_echo_is_applied_on_reload(setup: Setup) -> None:
    assert not setup.router.echo_served_endpoint
    setup.path.write_text(zone_config("a", "conformance: {echoServedEndpoint: true}\n"))
    assert setup.reloader.reload("test")
    assert setup.router.echo_served_endpoint


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("plugins: [", "invalid YAML"),
        ("plugins: [{type: nope}]", "plugins[0].type: unknown plugin type 'nope'"),
        (
            "plugins: [{type: prefix-cache-scorer, parameters: {blockSize: 0}}]",
            "blockSize: must be >= 1",
        ),
        (  # fails only when bound, after the other plugins were built
            "plugins: [{type: pd-profile-handler}, {type: random-picker}]",
            "decodeProfile: no scheduling profile named 'decode'",
        ),
        (zone_config("b", "dataLayer: {scrapeIntervalSeconds: 1}\n"), "dataLayer changed"),
        (zone_config("b", "disaggregation: {coordinator: kv-pool}\n"), "disaggregation changed"),
        (zone_config("b", "endpoints: [{address: '10.0.0.9:80'}]\n"), "endpoints changed"),
        (  # its KV-event subscribers start with the process
            zone_config("b", scorer="precise-prefix-cache-scorer"),
            "plugin(s) precise-prefix-cache-scorer read KV events and were added",
        ),
        (zone_config("b", "loraPlacement: {enabled: true}\n"), "loraPlacement changed"),
    ],
)
def test_a_bad_file_keeps_the_running_config(
    setup: Setup, caplog: pytest.LogCaptureFixture, text: str, message: str
) -> None:
    before = setup.scheduler
    setup.path.write_text(text)
    with caplog.at_level(logging.ERROR, logger="epp.serving.reload"):
        assert not setup.reloader.reload("test")
    assert setup.scheduler is before and setup.routed_to() == ZONE_A.address
    assert (setup.count("success"), setup.count("failure")) == (0, 1)
    (record,) = caplog.records
    assert "the previous config still runs" in record.getMessage()
    assert str(setup.path) in record.getMessage() and message in record.getMessage()


def test_a_changed_latency_model_restarts_the_same_model_from_the_new_priors(
    setup: Setup,
) -> None:
    model = setup.scheduler.latency
    setup.routed_to()  # the model learns of the endpoints it saw
    assert model.addresses()
    setup.path.write_text(zone_config("a", "latencyModel: {overheadMs: 50}\n"))
    assert setup.reloader.reload("test")
    assert setup.scheduler.latency is model  # metrics and /status keep reporting it
    assert model.priors == LatencyPriors(overhead_ms=50.0) and not model.addresses()
    # unchanged priors: what was learned stays
    setup.routed_to()
    setup.path.write_text(zone_config("b", "latencyModel: {overheadMs: 50}\n"))
    assert setup.reloader.reload("test")
    assert model.addresses()


def test_the_file_counts_as_changed_only_when_its_text_changed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "epp.yaml"
    path.write_text(zone_config("a"))
    file = ConfigFile(path)
    file.load()
    assert not file.changed()
    path.write_text(zone_config("a") + "\n")  # another mtime and size
    assert file.changed()
    file.load()
    path.write_text(zone_config("a") + "\n")  # the same text again
    assert not file.changed()
    path.unlink()
    with caplog.at_level(logging.WARNING, logger="epp.serving.reload"):
        assert not file.changed() and not file.changed()
    assert len(caplog.records) == 1 and "still running the config last read" in caplog.text


def test_a_file_missing_at_start_is_one_error_and_no_still_running_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    file = ConfigFile(tmp_path / "missing.yaml")
    with (
        caplog.at_level(logging.WARNING, logger="epp.serving.reload"),
        pytest.raises(ConfigError, match="cannot read config file: No such file"),
    ):
        file.load()
    assert caplog.records == []  # nothing was read: nothing is "still running"


def test_prefix_index_metric_follows_the_running_scheduler(setup: Setup) -> None:
    setup.metrics.report_prefix_indexes(
        lambda: {
            n: p.index
            for n, p in setup.reloader.scheduler.plugins.items()
            if isinstance(p, PrefixCacheScorer)
        }
    )
    samples = {"plugin": "prefix-cache-scorer"}
    assert setup.metrics.registry.get_sample_value("epp_prefix_index_blocks", samples) == 0
    setup.path.write_text(zone_config("a", scorer="queue-scorer"))
    assert setup.reloader.reload("test")
    assert setup.metrics.registry.get_sample_value("epp_prefix_index_blocks", samples) is None


def test_flags_still_override_the_reloaded_file(tmp_path: Path) -> None:
    """`epp serve --coordinator` overrides the file at start and at every reload, so the
    file's own (unchanged) coordinator is no restart-only change."""
    path = tmp_path / "epp.yaml"
    path.write_text(zone_config("a"))
    file = ConfigFile(path, lambda c: replace(c, disaggregation=DisaggConfig("kv-pool")))
    cfg = file.load()
    assert cfg.disaggregation.coordinator == "kv-pool"
    datastore = Datastore()
    datastore.add(ZONE_B)
    metrics = EppMetrics(datastore)
    scheduler = config.instantiate(cfg, config.builtin_registry())
    router = make_router(datastore, scheduler, metrics)
    reloader = ConfigReloader(file, cfg, scheduler, router, metrics.config_reloads, poll_s=0)
    path.write_text(zone_config("b"))
    assert reloader.reload("test")
    assert reloader.config.disaggregation.coordinator == "kv-pool"


def test_an_unchanged_kv_event_plugin_is_kept_through_a_reload(tmp_path: Path) -> None:
    setup = Setup(tmp_path / "epp.yaml", zone_config("a", scorer="precise-prefix-cache-scorer"))
    before = setup.scheduler.plugins["precise-prefix-cache-scorer"]
    setup.path.write_text(zone_config("b", scorer="precise-prefix-cache-scorer"))
    assert setup.reloader.reload("test")
    assert setup.routed_to() == ZONE_B.address
    assert setup.scheduler.plugins["precise-prefix-cache-scorer"] is before
    setup.path.write_text(zone_config("b"))  # the precise scorer taken out
    assert not setup.reloader.reload("test")
    assert setup.scheduler.plugins["precise-prefix-cache-scorer"] is before
