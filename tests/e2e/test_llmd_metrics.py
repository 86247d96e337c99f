"""After traffic through real Envoy, a live EPP's /metrics carries the llm-d Router's
canonical llm_d_epp_* series and the older names beside them, with their labels, plus
the standard process_* and python_* series (docs/metrics.md)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from epp_harness.stack import LocalStack
from tests.support.live_metrics import samples, stack_with_traffic

pytestmark = pytest.mark.e2e

# canonical name -> the older twin (None: the llm-d Router has none)
PAIRS = {
    "llm_d_epp_request_total": "inference_objective_request_total",
    "llm_d_epp_request_error_total": "inference_objective_request_error_total",
    "llm_d_epp_request_duration_seconds_count":
        "inference_objective_request_duration_seconds_count",
    "llm_d_epp_request_input_tokens_count": "inference_objective_input_tokens_count",
    "llm_d_epp_request_output_tokens_count": "inference_objective_output_tokens_count",
    "llm_d_epp_request_cached_tokens_count": "inference_objective_prompt_cached_tokens_count",
    "llm_d_epp_request_ntpot_seconds_count":
        "inference_objective_normalized_time_per_output_token_seconds_count",
    "llm_d_epp_request_ttft_seconds_count": None,
    "llm_d_epp_request_running": "inference_objective_running_requests",
    "llm_d_epp_average_kv_cache_utilization": "inference_pool_average_kv_cache_utilization",
    "llm_d_epp_average_queue_size": "inference_pool_average_queue_size",
    "llm_d_epp_average_running_requests": "inference_pool_average_running_requests",
    "llm_d_epp_ready_endpoints": "inference_pool_ready_pods",
    "llm_d_epp_std_dev_queue_size": None,
    "llm_d_epp_scheduler_e2e_duration_seconds_count":
        "inference_extension_scheduler_e2e_duration_seconds_count",
    "llm_d_epp_scheduler_attempts_total": "inference_extension_scheduler_attempts_total",
    "llm_d_epp_pd_decision_total": "llm_d_inference_scheduler_pd_decision_total",
    "llm_d_epp_disagg_decision_total": "llm_d_inference_scheduler_disagg_decision_total",
    "llm_d_epp_info": "inference_extension_info",
}  # fmt: skip
STANDARD = ("process_cpu_seconds_total", "process_resident_memory_bytes",
            "process_open_fds", "python_info", "python_gc_collections_total")  # fmt: skip


@pytest.fixture(scope="module")
def live() -> Iterator[LocalStack]:
    with stack_with_traffic() as stack:
        yield stack


def total(
    found: dict[str, list[tuple[dict[str, str], float]]], sample: str, **labels: str
) -> float:
    return sum(v for lab, v in found.get(sample, []) if labels.items() <= lab.items())


def test_both_generations_of_names_count_the_same(live: LocalStack) -> None:
    found = samples(live)
    for current, legacy in PAIRS.items():
        assert current in found, current
        if legacy is not None:
            assert legacy in found, legacy
            assert total(found, current) == total(found, legacy), (current, legacy)
    for name in STANDARD:
        assert name in found, name


def test_values_and_labels_follow_the_traffic(live: LocalStack) -> None:
    found = samples(live)
    model = {"model_name": "sim-model", "target_model_name": "sim-model"}
    routed = {**model, "fairness_id": "default-flow", "priority": "0"}
    assert total(found, "llm_d_epp_request_total", **routed) == 3
    assert total(found, "inference_objective_request_total", **model, priority="0") == 3
    assert total(found, "llm_d_epp_request_total", model_name="no-such-model") == 1
    # the model server's 404 and the EPP's own 400
    assert total(found, "llm_d_epp_request_error_total", error_code="ModelServerError") == 1
    assert total(found, "inference_objective_request_error_total", error_code="BadRequest") == 1
    # completions with usage: three of sim-model (4 output tokens each)
    assert total(found, "llm_d_epp_request_output_tokens_sum", **routed) == 12
    assert total(found, "llm_d_epp_request_ttft_seconds_count", streaming="true") == 1
    assert total(found, "llm_d_epp_pd_decision_total", decision_type="prefill-decode") == 1
    assert (
        total(found, "llm_d_inference_scheduler_pd_decision_total", decision_type="decode-only")
        == 3
    )
    assert total(found, "llm_d_epp_ready_endpoints", name="default") == 2
    assert total(found, "llm_d_epp_info") == 1
    assert total(found, "llm_d_epp_request_running", **routed) == 0  # all finished
    # learned from the simulator's usage: its tokens are about 4 characters
    assert 3.0 <= total(found, "epp_prompt_chars_per_token") <= 4.5
