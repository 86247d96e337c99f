"""bench.vllm_routing's pure parts: vLLM's counters read from /metrics text, their deltas
over a run, the report's rows and table, and the workload's sizes in the model's tokens."""

from __future__ import annotations

import math
from pathlib import Path

from bench import vllm_routing, vllm_routing_report
from bench.workload import WorkloadSpec, system_prompts
from epp.common.tokenization import HfTokenizer

TINY = Path(__file__).resolve().parents[2] / "fixtures" / "tiny-llama"

# These counters in the form vLLM 0.32's /metrics writes them (labels as its loggers set)
METRICS = """\
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="tiny-llama"} 4480.0
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="tiny-llama"} 1792.0
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="tiny-llama"} 1.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="tiny-llama"} 4.0
vllm:request_success_total{engine="0",finished_reason="abort",model_name="tiny-llama"} 0.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny-llama"} 0.0
"""


def test_counters_sum_every_label_of_the_three_counters() -> None:
    assert vllm_routing_report.counters(METRICS) == {
        "prefix_cache_hits_tokens": 1792.0,
        "prefix_cache_queries_tokens": 4480.0,
        "requests_done": 5.0,
    }


EPP_METRICS = """\
# HELP epp_kv_event_total KV-event stream counters by plugin and kind.
# TYPE epp_kv_event_total counter
epp_kv_event_total{kind="events",plugin="precise-prefix-cache-scorer"} 1234.0
epp_kv_event_total{kind="gaps",plugin="precise-prefix-cache-scorer"} 0.0
epp_kv_event_total{kind="decode_errors",plugin="precise-prefix-cache-scorer"} 0.0
# HELP epp_kv_index_endpoints Endpoints in the precise index.
# TYPE epp_kv_index_endpoints gauge
epp_kv_index_endpoints{plugin="precise-prefix-cache-scorer",state="trusted"} 3.0
epp_kv_index_endpoints{plugin="precise-prefix-cache-scorer",state="untrusted"} 1.0
# HELP epp_requests_total Requests.
# TYPE epp_requests_total counter
epp_requests_total{result="ok"} 91.0
"""


def test_the_epps_precise_index_view_and_its_report_line() -> None:
    view = vllm_routing_report.kv_index_view(EPP_METRICS)
    assert view == {
        "events_events": 1234.0,
        "events_gaps": 0.0,
        "events_decode_errors": 0.0,
        "endpoints_trusted": 3.0,
        "endpoints_untrusted": 1.0,
    }
    lines = vllm_routing_report.kv_index_lines({"default": {}, "precise-prefix": view})
    assert lines == [
        "- `precise-prefix`, after its last rate: the EPP's precise index followed 3 "
        "servers' KV events as trusted and 1 as untrusted (a server that published nothing "
        "since the EPP started is in neither); 1,234 events, 0 gaps, 0 decode errors"
    ]


def snap(instance: str, hits: float, queries: float, done: float) -> dict[str, object]:
    return {
        "instance": instance,
        "prefix_cache_hits_tokens": hits,
        "prefix_cache_queries_tokens": queries,
        "requests_done": done,
    }


def test_deltas_sum_the_servers_moves_and_keep_each_servers_requests() -> None:
    before = [snap("a:1", 100, 1000, 3), snap("b:2", 0, 0, 0)]
    after = [snap("a:1", 1380, 3000, 5), snap("b:2", 640, 2000, 2)]
    moved = vllm_routing_report.deltas(before, after)
    assert moved == {
        "vllm_hit_tokens": 1920,
        "vllm_query_tokens": 4000,
        "vllm_hit_rate": 0.48,
        "per_server": {"a:1": 2, "b:2": 2},
    }


def test_no_queries_is_no_hit_rate_not_zero() -> None:
    same = [snap("a:1", 5, 10, 1)]
    moved = vllm_routing_report.deltas(same, same)
    assert math.isnan(moved["vllm_hit_rate"])
    row = vllm_routing_report.report_row(routing_row(), moved)
    assert row["vllm_hit_rate"] is None and row["ttft_p90_ms"] is None  # JSON has no NaN
    assert "| \N{EN DASH} |" in vllm_routing_report.table([row])[2]


def routing_row() -> dict[str, object]:
    """The fields of a bench.routing row the report keeps, and some it drops."""
    return {
        "policy": "precise-prefix",
        "rate": 4.0,
        "duration_s": 20.0,
        "sent": 80,
        "ok": 78,
        "errors": 2,
        "error_kinds": {"timeout": 1, "http-503": 1},
        "ttft_p50_ms": 31.4,
        "ttft_p90_ms": math.nan,
        "throughput_rps": 3.9,
        "cpu": {"machine": 150.0},
        "prefix_hit_rate": 0.5,
        "requests": {"group": []},
    }


def test_a_report_row_and_its_table_line() -> None:
    moved = vllm_routing_report.deltas(
        [snap("a:1", 0, 0, 0), snap("b:2", 0, 0, 0)],
        [snap("a:1", 1536, 2048, 40), snap("b:2", 512, 2048, 38)],
    )
    row = vllm_routing_report.report_row(routing_row(), moved)
    assert "requests" not in row and "prefix_hit_rate" not in row
    assert row["vllm_hit_rate"] == 0.5
    header, _, line = vllm_routing_report.table([row])
    assert header.count("|") == line.count("|")
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells == [
        "precise-prefix",
        "4",
        "80",
        "78",
        "2 http-503:1 timeout:1",
        "50.0",
        "2,048 / 4,096",
        "31",
        "\N{EN DASH}",
        "40 38",
    ]


def test_spec_tokens_convert_model_tokens_to_the_workloads_characters() -> None:
    # 1,000 tokens of a tokenizer taking 1.2 characters each: 1,200 characters, which
    # bench.workload writes as 300 of its 4-character tokens
    assert vllm_routing.spec_tokens(1000, 1.2) == 300
    assert vllm_routing.spec_tokens(1, 1.2) == 1


def test_the_scaled_prefix_is_about_the_asked_model_tokens_long() -> None:
    tokenizer = HfTokenizer(TINY)
    probe = WorkloadSpec(groups=2, prefix_tokens=1000)
    ratio = vllm_routing.chars_per_model_token(system_prompts(probe), tokenizer)
    assert 1.0 < ratio < 2.0  # byte-level BPE on bench.workload's pseudo-words
    spec = WorkloadSpec(groups=2, prefix_tokens=vllm_routing.spec_tokens(1000, ratio))
    for prompt in system_prompts(spec):
        assert abs(len(tokenizer.encode(prompt, add_special_tokens=False) or []) - 1000) < 50
