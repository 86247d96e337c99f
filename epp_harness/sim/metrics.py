"""vLLM-named Prometheus metrics for one simulator, on a registry of its own (or
SGLang's / TensorRT-LLM's names for the routing signals: epp_harness.sim.dialects).

Gauges and counters are read from the engine when scraped, so they always show the
live state and cost nothing per request; only the TTFT histogram is observed as
requests run. Every series carries ``model_name``, as vLLM's do. The P/D handoff
counters and ``sim:instance_info`` (role, KV connector) are the simulator's own
(``sim:`` prefix): real servers have no such series, tests and benchmarks read them.
Of prometheus_client's process collector (on vLLM's page) it has only
``process_start_time_seconds``, which the EPP reads (a new value: the server restarted).
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from epp_harness.sim.dialects import DIALECTS
from epp_harness.sim.engine import Engine
from epp_harness.sim.handoff import SimHandoff
from epp_harness.sim.lora import LoraSlots

# vLLM's buckets for vllm:time_to_first_token_seconds.
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip

METRICS_CONTENT_TYPE = CONTENT_TYPE_LATEST

# sim:<name>_total, read from the HandoffCounters field <name> (also in /sim/stats)
HANDOFF_COUNTERS = (
    ("kv_transfers", "Requests whose prompt KV came from another instance."),
    ("recomputed_prefills", "Requests handed KV they could not get, so prefilled here."),
    ("local_prefills", "Requests with no KV handoff, prefilled here."),
    ("prefill_legs", "Requests served as the prefill leg of a P/D pair."),
    ("bootstrap_failures", "Bootstrap rendezvous that timed out or failed, either side."),
)


def _counter(name: str, doc: str, model: list[str], value: float) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=["model_name"])
    family.add_metric(model, value)
    return family


def _lora_info(lora: LoraSlots) -> GaugeMetricFamily:
    """vLLM's LoRA gauge: a series per state, valued when it was last current."""
    family = GaugeMetricFamily(
        "vllm:lora_requests_info",
        "Running stats on lora requests.",
        labels=["max_lora", "running_lora_adapters", "waiting_lora_adapters"],
    )
    for running, waiting, at in lora.info_series():
        family.add_metric([str(lora.max_loras), running, waiting], at)
    return family


class _EngineCollector(Collector):
    """Reads the engine's live state and counters at scrape time."""

    def __init__(self, engine: Engine, handoff: SimHandoff, lora: LoraSlots | None) -> None:
        self._engine = engine
        self._handoff = handoff
        self._lora = lora

    def collect(self) -> Iterable[Metric]:
        engine, config = self._engine, self._engine.config
        model = [config.model]
        counters = engine.counters

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, doc, labels=["model_name"])
            family.add_metric(model, value)
            return family

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            return _counter(name, doc, model, value)

        names = DIALECTS[config.metrics_dialect]
        lora = self._lora
        # requests held back for an adapter slot wait in the engine's queue in vLLM
        waiting = engine.waiting + (lora.waiting_requests if lora is not None else 0)
        yield gauge(names.running, "Requests in model execution.", engine.running)
        yield gauge(names.waiting, "Requests waiting to run.", waiting)
        yield gauge(
            names.kv_usage, "KV-cache usage. 1 means 100 percent usage.", engine.kv_cache_usage
        )
        if names.cache_config is not None:
            info = GaugeMetricFamily(
                names.cache_config,
                "Information of the KV cache config.",
                labels=["model_name", names.block_size_label, names.num_blocks_label],
            )
            info.add_metric([config.model, str(config.block_size), str(config.kv_blocks)], 1.0)
            yield info
        yield from self._handoff_metrics()
        if config.metrics_dialect != "vllm":
            return
        if lora is not None:
            yield _lora_info(lora)
        yield counter(
            "vllm:prompt_tokens", "Prefill tokens processed.", counters.prompt_tokens_total
        )
        yield counter(
            "vllm:generation_tokens",
            "Generation tokens processed.",
            counters.generation_tokens_total,
        )
        success = CounterMetricFamily(
            "vllm:request_success",
            "Successfully processed requests.",
            labels=["model_name", "finished_reason"],
        )
        success.add_metric([config.model, "length"], counters.request_success_total)
        yield success
        yield counter(
            "vllm:prefix_cache_queries",
            "Prefix-cache queries, in queried tokens.",
            counters.prefix_cache_queries_tokens,
        )
        yield counter(
            "vllm:prefix_cache_hits",
            "Prefix-cache hits, in cached tokens.",
            counters.prefix_cache_hits_tokens,
        )

    def _handoff_metrics(self) -> Iterable[Metric]:
        config, handoffs = self._engine.config, self._handoff.counters
        model = [config.model]
        info = GaugeMetricFamily(
            "sim:instance_info",
            "The simulator's P/D role and KV connector.",
            labels=["model_name", "role", "kv_connector", "engine_id"],
        )
        info.add_metric(
            [config.model, config.role.value, config.kv_connector.value, self._handoff.engine_id],
            1.0,
        )
        yield info
        for name, doc in HANDOFF_COUNTERS:
            yield _counter(f"sim:{name}", doc, model, getattr(handoffs, name))


class SimMetrics:
    """The simulator's registry: a TTFT histogram now, the engine's state once attached."""

    def __init__(self, model: str, dialect: str = "vllm") -> None:
        self.registry = CollectorRegistry()
        histogram = Histogram(
            DIALECTS[dialect].ttft,
            "Histogram of time to first token in seconds.",
            ["model_name"],
            buckets=TTFT_BUCKETS,
            registry=self.registry,
        )
        self._ttft = histogram.labels(model_name=model)
        started = Gauge(
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds.",
            registry=self.registry,
        )
        started.set(time.time())

    def observe_ttft(self, seconds: float) -> None:
        self._ttft.observe(seconds)

    def attach(self, engine: Engine, handoff: SimHandoff, lora: LoraSlots | None = None) -> None:
        """Expose ``engine``'s, ``handoff``'s and ``lora``'s gauges and counters (once)."""
        self.registry.register(_EngineCollector(engine, handoff, lora))

    def render(self) -> bytes:
        """The Prometheus text exposition of everything registered."""
        return generate_latest(self.registry)
