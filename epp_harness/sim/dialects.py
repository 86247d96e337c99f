"""The metric names each engine's ``/metrics`` uses for what routers read.

The simulator emits its routing signals (queue, running batch, KV usage, cache
geometry) and its TTFT histogram under one engine's names (``--metrics-dialect``), the
same names :mod:`epp.datalayer.engines` reads (docs/architecture.md, model-server
metrics). vLLM's other series (token and prefix-cache counters, LoRA info) are emitted
in the vLLM dialect only.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Dialect:
    waiting: str
    running: str
    kv_usage: str
    ttft: str
    # the cache-geometry info gauge and its two labels; None where the engine has none
    cache_config: str | None = None
    block_size_label: str = "block_size"
    num_blocks_label: str = "num_gpu_blocks"


DIALECTS = {
    "vllm": Dialect(
        waiting="vllm:num_requests_waiting",
        running="vllm:num_requests_running",
        kv_usage="vllm:kv_cache_usage_perc",
        ttft="vllm:time_to_first_token_seconds",
        cache_config="vllm:cache_config_info",
    ),
    "sglang": Dialect(
        waiting="sglang:num_queue_reqs",
        running="sglang:num_running_reqs",
        kv_usage="sglang:token_usage",
        ttft="sglang:time_to_first_token_seconds",
        cache_config="sglang:cache_config_info",
        block_size_label="page_size",
        num_blocks_label="num_pages",
    ),
    "trtllm": Dialect(
        waiting="trtllm_num_requests_waiting",
        running="trtllm_num_requests_running",
        kv_usage="trtllm_kv_cache_utilization",
        ttft="trtllm_time_to_first_token_seconds",
    ),
}
