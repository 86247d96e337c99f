# Exposition lines are kept as the servers write them, however long.
# ruff: noqa: E501
"""Model-server /metrics pages -> EndpointMetrics (epp.datalayer.prometheus), on plain
strings shaped like what vLLM, SGLang and TensorRT-LLM serve."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Gauge, generate_latest

from epp.datalayer.engines import ENGINES, EngineMetricNames, engine_names
from epp.datalayer.prometheus import MetricsParseError, parse_metrics

VLLM = engine_names("vllm")
SGLANG = engine_names("sglang")
TRTLLM = engine_names("trtllm")

# A vLLM (v0.10+) page serving two models (one base, one with a different name on the
# same engine): histograms, counters with look-alike names, two model_name series per
# gauge, three lora_requests_info series recorded at different times.
VLLM_PAGE = """\
# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 12010.0
# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.
# TYPE process_start_time_seconds gauge
process_start_time_seconds 1.75315470266e+09
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 3.0
vllm:num_requests_running{engine="0",model_name="llama-alias"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 4.0
vllm:num_requests_waiting{engine="0",model_name="llama-alias"} 1.0
# HELP vllm:num_requests_waiting_by_reason Requests waiting, by reason.
# TYPE vllm:num_requests_waiting_by_reason gauge
vllm:num_requests_waiting_by_reason{engine="0",reason="capacity"} 99.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.25
vllm:kv_cache_usage_perc{engine="0",model_name="llama-alias"} 0.25
# HELP vllm:lora_requests_info Running stats on lora requests.
# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{max_lora="4",running_lora_adapters="sql-lora",waiting_lora_adapters=""} 1.7453e+09
vllm:lora_requests_info{max_lora="4",running_lora_adapters="sql-lora,chat-lora",waiting_lora_adapters="tool-lora"} 1.7453002e+09
vllm:lora_requests_info{max_lora="4",running_lora_adapters="",waiting_lora_adapters="sql-lora"} 1.7453001e+09
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.9",num_cpu_blocks="None",num_gpu_blocks="27840",prefix_caching_hash_algo="builtin"} 1.0
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 10234.0
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 8000.0
vllm:prefix_cache_queries_total{engine="0",model_name="llama-alias"} 2000.0
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 2500.0
vllm:prefix_cache_hits_total{engine="0",model_name="llama-alias"} 500.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="meta-llama/Llama-3.1-8B-Instruct"} 12.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 12.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.84
"""

# vLLM before v0.10: the KV gauge was gpu_cache_usage_perc, no lora, no cache config.
VLLM_OLD_PAGE = """\
# HELP vllm:num_requests_running Number of requests currently running on GPU.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="facebook/opt-125m"} 1.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="facebook/opt-125m"} 0.0
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="facebook/opt-125m"} 0.0625
"""

SGLANG_PAGE = """\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{engine_type="unified",model_name="Qwen/Qwen2.5-7B-Instruct",pp_rank="0",tp_rank="0"} 7.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{engine_type="unified",model_name="Qwen/Qwen2.5-7B-Instruct",pp_rank="0",tp_rank="0"} 2.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{engine_type="unified",model_name="Qwen/Qwen2.5-7B-Instruct",pp_rank="0",tp_rank="0"} 0.42
# HELP sglang:cache_config_info Information of the KV cache config.
# TYPE sglang:cache_config_info gauge
sglang:cache_config_info{num_pages="170000",page_size="1"} 1.0
# HELP sglang:prompt_tokens_total Number of prefill tokens processed.
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="Qwen/Qwen2.5-7B-Instruct"} 5120.0
"""

TRTLLM_PAGE = """\
# HELP trtllm_num_requests_running Number of requests currently running.
# TYPE trtllm_num_requests_running gauge
trtllm_num_requests_running{engine_type="trtllm",model_name="llama"} 5.0
# HELP trtllm_num_requests_waiting Number of requests waiting.
# TYPE trtllm_num_requests_waiting gauge
trtllm_num_requests_waiting{engine_type="trtllm",model_name="llama"} 6.0
# HELP trtllm_kv_cache_utilization KV cache utilization.
# TYPE trtllm_kv_cache_utilization gauge
trtllm_kv_cache_utilization{engine_type="trtllm",model_name="llama"} 0.5
"""


def test_vllm_page() -> None:
    m = parse_metrics(VLLM_PAGE, VLLM, now=123.5)
    assert m.updated_at == 123.5
    assert m.waiting == 5.0  # summed over model_name; waiting_by_reason not mixed in
    assert m.running == 5.0
    assert m.kv_usage == 0.25  # a fraction: averaged over series, never above 1
    # the newest lora_requests_info series (largest timestamp value) wins
    assert m.lora_running == frozenset({"sql-lora", "chat-lora"})
    assert m.lora_waiting == frozenset({"tool-lora"})
    assert m.max_lora == 4
    assert m.block_size == 16
    assert m.num_blocks == 27840
    # prefix-cache counters, summed over model_name (`epp top` takes their rates)
    assert (m.prefix_cache_queries, m.prefix_cache_hits) == (10000.0, 3000.0)
    assert m.started_at == 1.75315470266e09  # the process's start: a new one, a restart
    assert m.orca == {}


def test_vllm_old_kv_name() -> None:
    m = parse_metrics(VLLM_OLD_PAGE, VLLM, now=1.0)
    assert (m.waiting, m.running, m.kv_usage) == (0.0, 1.0, 0.0625)
    # absent from this page: None, not zero
    assert m.lora_running == frozenset() and m.lora_waiting == frozenset()
    assert m.max_lora is None and m.block_size is None and m.num_blocks is None


def test_current_kv_name_preferred_over_old() -> None:
    text = (
        'vllm:gpu_cache_usage_perc{model_name="m"} 0.9\n'
        'vllm:kv_cache_usage_perc{model_name="m"} 0.1\n'
    )
    assert parse_metrics(text, VLLM, now=0).kv_usage == 0.1


def test_kv_usage_is_the_mean_of_data_parallel_engines() -> None:
    text = (
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.75\n'
        'vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.25\n'
    )
    assert parse_metrics(text, VLLM, now=0).kv_usage == 0.5


@pytest.mark.parametrize(
    ("series", "running", "waiting", "max_lora"),
    [
        # newest series first, last and in the middle
        (
            [("a,b", "", "2", "300"), ("a", "", "2", "100"), ("", "c", "2", "200")],
            {"a", "b"},
            set(),
            2,
        ),
        (
            [("a", "", "2", "100"), ("", "c", "2", "200"), ("x, y ,", "z", "8", "300")],
            {"x", "y"},
            {"z"},
            8,
        ),
        ([("a", "", "2", "100"), ("", "c,d", "3", "200")], set(), {"c", "d"}, 3),
        # a max_lora that is not an integer is not reported
        ([("a", "", "none", "1")], {"a"}, set(), None),
    ],
)
def test_lora_newest_series_wins(
    series: list[tuple[str, str, str, str]],
    running: set[str],
    waiting: set[str],
    max_lora: int | None,
) -> None:
    text = "# TYPE vllm:lora_requests_info gauge\n" + "".join(
        f'vllm:lora_requests_info{{max_lora="{m}",running_lora_adapters="{r}",'
        f'waiting_lora_adapters="{w}"}} {ts}\n'
        for r, w, m, ts in series
    )
    m = parse_metrics(text, VLLM, now=0)
    assert m.lora_running == frozenset(running)
    assert m.lora_waiting == frozenset(waiting)
    assert m.max_lora == max_lora
    assert m.waiting is None and m.running is None and m.kv_usage is None


@pytest.mark.parametrize(
    ("labels", "block_size", "num_blocks"),
    [
        ('block_size="32",num_gpu_blocks="1234"', 32, 1234),
        ('block_size="16",num_gpu_blocks="None"', 16, None),  # not profiled yet
        ('num_gpu_blocks="10"', None, 10),
        ('block_size="0",num_gpu_blocks="1_000"', None, None),
        ('block_size="+16",num_gpu_blocks="-5"', None, None),
    ],
)
def test_cache_config_labels(labels: str, block_size: int | None, num_blocks: int | None) -> None:
    m = parse_metrics(f"vllm:cache_config_info{{{labels}}} 1.0\n", VLLM, now=0)
    assert (m.block_size, m.num_blocks) == (block_size, num_blocks)


def test_sglang_page() -> None:
    m = parse_metrics(SGLANG_PAGE, SGLANG, now=7.0)
    assert (m.waiting, m.running, m.kv_usage) == (2.0, 7.0, 0.42)
    assert (m.block_size, m.num_blocks) == (1, 170000)
    assert m.max_lora is None and m.lora_running == frozenset()


def test_trtllm_page() -> None:
    m = parse_metrics(TRTLLM_PAGE, TRTLLM, now=7.0)
    assert (m.waiting, m.running, m.kv_usage) == (6.0, 5.0, 0.5)
    assert m.block_size is None and m.num_blocks is None and m.max_lora is None


def test_absent_metrics_stay_none() -> None:
    m = parse_metrics('vllm:num_requests_waiting{model_name="m"} 0\n', VLLM, now=0)
    assert m.waiting == 0.0
    assert m.running is None and m.kv_usage is None
    assert m.block_size is None and m.num_blocks is None and m.max_lora is None
    assert m.prefix_cache_queries is None and m.prefix_cache_hits is None
    assert m.started_at is None


def test_sample_timestamps_and_crlf_line_ends() -> None:
    text = (
        'vllm:num_requests_waiting{model_name="m"} 3 1700000000000\r\n'
        'vllm:num_requests_running{model_name="m"} 1\r\n'
    )
    m = parse_metrics(text, VLLM, now=0)
    assert (m.waiting, m.running) == (3.0, 1.0)


def test_label_values_with_commas_braces_and_quotes() -> None:
    text = (
        'vllm:num_requests_running{model_name="a,b} \\"c\\"",x="y"} 2\n'
        'vllm:lora_requests_info{max_lora="1",running_lora_adapters="l{1}",'
        'waiting_lora_adapters=""} 5\n'
    )
    m = parse_metrics(text, VLLM, now=0)
    assert m.running == 2.0
    assert m.lora_running == frozenset({"l{1}"})


@pytest.mark.parametrize(
    "text",
    [
        "",
        "garbage garbage\n",
        "<html><body><h1>502 Bad Gateway</h1></body></html>\n",
        '{"num_requests_waiting": 3}',
        # valid Prometheus text, but none of vLLM's metrics: the wrong engine
        SGLANG_PAGE,
        # every Python server has a start time: alone it does not make a vLLM page
        "process_start_time_seconds 1.7e+09\n",
    ],
)
def test_page_without_the_engines_metrics_is_an_error(text: str) -> None:
    with pytest.raises(MetricsParseError, match="no vllm metrics in the text"):
        parse_metrics(text, VLLM, now=0)


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ('vllm:num_requests_waiting{model_name="m" 3', "malformed line"),
        ("vllm:num_requests_waiting three", "malformed line"),
        ('vllm:num_requests_running{model_name="m",model_name="n"} 3', "malformed line"),
        ('vllm:kv_cache_usage_perc{model_name="m"} NaN', "non-finite value nan"),
        ('vllm:num_requests_waiting{model_name="m"} +Inf', "non-finite value inf"),
    ],
)
def test_malformed_metric_line_is_an_error(line: str, reason: str) -> None:
    text = VLLM_OLD_PAGE + line + "\n"
    with pytest.raises(MetricsParseError, match=reason) as err:
        parse_metrics(text, VLLM, now=0)
    assert isinstance(err.value, ValueError)
    if reason == "malformed line":
        assert line[:40] in str(err.value)  # names the offending line


def test_malformed_lines_of_other_metrics_are_not_read() -> None:
    # only the engine's own metrics are parsed (the rest of a vLLM page is ~95 % of it)
    text = VLLM_OLD_PAGE + 'vllm:some_histogram_bucket{le="0.1" garbage\n'
    assert parse_metrics(text, VLLM, now=0).running == 1.0


def test_unknown_engine() -> None:
    with pytest.raises(
        ValueError, match=r"unknown model-server engine 'tgi'.*sglang, trtllm, vllm"
    ):
        engine_names("tgi")
    assert set(ENGINES) == {"vllm", "sglang", "trtllm"}
    assert all(engine_names(name).engine == name for name in ENGINES)


def test_engine_names_need_a_kv_metric() -> None:
    with pytest.raises(ValueError, match="kv_usage"):
        EngineMetricNames(engine="x", waiting="w", running="r", kv_usage=())


@given(
    waiting=st.lists(st.integers(0, 10_000), min_size=1, max_size=5),
    kv=st.floats(0, 1, allow_nan=False),
)
def test_prometheus_client_exposition_round_trips(waiting: list[int], kv: float) -> None:
    """Whatever prometheus_client (which vLLM uses) writes, we read back."""
    registry = CollectorRegistry()
    w = Gauge("vllm:num_requests_waiting", "w", ["model_name"], registry=registry)
    for i, value in enumerate(waiting):
        w.labels(f"model-{i}").set(value)
    Gauge("vllm:kv_cache_usage_perc", "kv", registry=registry).set(kv)
    m = parse_metrics(generate_latest(registry).decode(), VLLM, now=0)
    assert m.waiting == sum(waiting)
    assert m.kv_usage is not None and math.isclose(m.kv_usage, kv, abs_tol=1e-12)
    assert m.running is None


def lora_page(*series: tuple[str, str, str, str]) -> str:
    """A page with vllm:num_requests_waiting and these lora_requests_info series
    (max_lora, running, waiting, value)."""
    lines = [
        "# TYPE vllm:num_requests_waiting gauge",
        'vllm:num_requests_waiting{model_name="m"} 0.0',
        "# TYPE vllm:lora_requests_info gauge",
    ]
    lines += [
        f'vllm:lora_requests_info{{max_lora="{m}",running_lora_adapters="{r}",'
        f'waiting_lora_adapters="{w}"}} {v}'
        for m, r, w, v in series
    ]
    return "\n".join(lines) + "\n"


def test_lora_info_the_newest_series_wins_even_when_it_is_empty() -> None:
    # an idle server: its newest state lists nothing; older busy states stay on the page
    page = lora_page(
        ("2", "a,b", "c", "1.7e9"),
        ("2", "", "", "1.7000005e9"),  # newest: idle
        ("2", "a", "", "1.7000001e9"),
    )
    m = parse_metrics(page, VLLM, now=1.0)
    assert m.lora_running == frozenset() and m.lora_waiting == frozenset()
    assert m.max_lora == 2  # LoRA state known: slots free


def test_lora_info_lists_trim_spaces_and_skip_empty_names() -> None:
    page = lora_page(("4", " a, b ,,c ", ",", "5"))
    m = parse_metrics(page, VLLM, now=1.0)
    assert m.lora_running == frozenset({"a", "b", "c"}) and m.lora_waiting == frozenset()


def test_lora_info_with_a_bad_max_lora_keeps_the_lists_without_a_slot_count() -> None:
    page = lora_page(("None", "a", "", "5"), ("-1", "b", "", "4"))
    m = parse_metrics(page, VLLM, now=1.0)
    assert m.lora_running == frozenset({"a"}) and m.max_lora is None


def test_without_lora_info_nothing_is_reported() -> None:
    m = parse_metrics(lora_page(), VLLM, now=1.0)
    assert m.max_lora is None and m.lora_running == frozenset()


def test_the_simulators_lora_info_reads_as_its_current_state() -> None:
    """What epp sim emits (epp_harness.sim.metrics) parses to its state: slots known."""
    from epp_harness.sim.config import SimConfig
    from epp_harness.sim.server import SimServer

    server = SimServer(SimConfig(enable_lora=True, max_loras=3, lora_modules=(("a", "/a"),)))
    m = parse_metrics(server.metrics.render().decode(), VLLM, now=1.0)
    assert m.max_lora == 3 and m.lora_running == frozenset() and m.waiting == 0.0
