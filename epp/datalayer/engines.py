"""Which Prometheus metrics each model-server engine exposes.

An endpoint's ``engine`` ("vllm", "sglang", "trtllm", or one an installed package adds,
see :mod:`epp.common.extensions`) picks one :class:`EngineMetricNames`;
:func:`epp.datalayer.prometheus.parse_metrics` reads a ``/metrics`` page with it.
"""

from __future__ import annotations

from dataclasses import dataclass

from epp.common.extensions import Installed, OpenRegistry, instance_of


@dataclass(frozen=True, slots=True)
class EngineMetricNames:
    """Metric (sample) names of one engine; ``None`` where the engine has no such metric."""

    engine: str
    waiting: str  # gauge: requests queued
    running: str  # gauge: requests in the running batch
    kv_usage: tuple[str, ...]  # gauge 0..1, candidate names in preference order
    lora_info: str | None = None  # info gauge, labels running/waiting_lora_adapters, max_lora
    cache_config: str | None = None  # info gauge whose labels give the KV-cache geometry
    block_size_label: str = "block_size"  # label of cache_config: tokens per block
    num_blocks_label: str = "num_gpu_blocks"  # label of cache_config: blocks on the device
    # counters: prompt tokens looked up in the prefix cache, and those found there
    prefix_queries: str | None = None
    prefix_hits: str | None = None
    # gauge: when the server process started (unix seconds; prometheus_client's process
    # collector, on every page of a Python engine): a new value means it restarted
    start_time: str | None = "process_start_time_seconds"

    def __post_init__(self) -> None:
        if not self.kv_usage:
            raise ValueError(f"engine {self.engine!r}: kv_usage needs at least one name")

    @property
    def metric_names(self) -> tuple[str, ...]:
        """The engine's own metric names (a page with none of them is not this
        engine's; ``start_time``, common to every Python server, is read besides)."""
        names = [self.waiting, self.running, *self.kv_usage]
        optional = (self.lora_info, self.cache_config, self.prefix_queries, self.prefix_hits)
        names += [n for n in optional if n is not None]
        return tuple(names)


def _dialect(obj: object, name: str) -> EngineMetricNames:
    names = instance_of(EngineMetricNames)(obj, name)
    if names.engine != name:
        raise ValueError(f"its engine is {names.engine!r}, not the entry point's name {name!r}")
    return names


# by engine name; installed packages add more (entry-point group epp.engines)
ENGINES: OpenRegistry[EngineMetricNames] = OpenRegistry(
    {
        "vllm": EngineMetricNames(
            engine="vllm",
            waiting="vllm:num_requests_waiting",
            running="vllm:num_requests_running",
            # vLLM renamed gpu_cache_usage_perc to kv_cache_usage_perc (v0.10)
            kv_usage=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
            lora_info="vllm:lora_requests_info",
            cache_config="vllm:cache_config_info",
            block_size_label="block_size",
            num_blocks_label="num_gpu_blocks",
            prefix_queries="vllm:prefix_cache_queries_total",
            prefix_hits="vllm:prefix_cache_hits_total",
        ),
        "sglang": EngineMetricNames(
            engine="sglang",
            waiting="sglang:num_queue_reqs",
            running="sglang:num_running_reqs",
            kv_usage=("sglang:token_usage",),
            cache_config="sglang:cache_config_info",
            block_size_label="page_size",
            num_blocks_label="num_pages",
        ),
        "trtllm": EngineMetricNames(
            engine="trtllm",
            waiting="trtllm_num_requests_waiting",
            running="trtllm_num_requests_running",
            kv_usage=("trtllm_kv_cache_utilization",),
        ),
    },
    Installed("epp.engines", "engine metric dialect", _dialect),
)


def engine_names(name: str) -> EngineMetricNames:
    """The metric names of engine ``name``; ValueError listing the known engines if unknown
    (an ExtensionError if an installed dialect of that name cannot be loaded)."""
    try:
        return ENGINES[name]
    except KeyError:
        known = ", ".join(sorted(ENGINES))
        raise ValueError(f"unknown model-server engine {name!r}; known engines: {known}") from None
