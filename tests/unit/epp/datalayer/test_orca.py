"""ORCA headers -> flat dicts -> EndpointMetrics, with reports built from the real
``xds.data.orca.v3.OrcaLoadReport`` message."""

from __future__ import annotations

import base64
import math
from typing import Any

import pytest
from google.protobuf import json_format
from hypothesis import given
from hypothesis import strategies as st
from xds.data.orca.v3.orca_load_report_pb2 import OrcaLoadReport

from epp.datalayer.orca import OrcaParseError, merge_orca, parse_orca, report_to_dict
from epp.types import EndpointMetrics

H = "endpoint-load-metrics"
HBIN = "endpoint-load-metrics-bin"


def full_report() -> Any:
    return OrcaLoadReport(
        cpu_utilization=0.7,
        mem_utilization=0.9,
        application_utilization=0.8,
        rps_fractional=12.5,
        eps=0.25,
        named_metrics={"kv_cache_usage_perc": 0.4, "num_requests_waiting": 3.0},
        utilization={"gpu": 0.5},
        request_cost={"tokens": 128.0, "zero": 0.0},
    )


FULL = {
    "cpu_utilization": 0.7,
    "mem_utilization": 0.9,
    "application_utilization": 0.8,
    "rps_fractional": 12.5,
    "eps": 0.25,
    "named_metrics.kv_cache_usage_perc": 0.4,
    "named_metrics.num_requests_waiting": 3.0,
    "utilization.gpu": 0.5,
    "request_cost.tokens": 128.0,
    "request_cost.zero": 0.0,
}


def b64(report: Any, *, pad: bool = True) -> str:
    text = base64.b64encode(report.SerializeToString()).decode()
    return text if pad else text.rstrip("=")


# -- absent ------------------------------------------------------------------------------


def test_no_orca_header_is_none() -> None:
    assert parse_orca({}) is None
    assert parse_orca({"content-type": "application/json", "x-other": "TEXT eps=1"}) is None


# -- TEXT --------------------------------------------------------------------------------


def test_text_with_equals_and_colons_and_spaces() -> None:
    value = (
        "TEXT cpu_utilization=0.7, mem_utilization: 0.9 ,application_utilization =0.8,"
        "  rps_fractional:12.5,eps=2.5e-1, named_metrics.kv_cache_usage_perc=0.4,"
        "named_metrics.num_requests_waiting:3, utilization.gpu=.5, request_cost.tokens=128,"
        "request_cost.zero=0"
    )
    assert parse_orca({H: value}) == FULL


def test_text_as_vllm_sends_it() -> None:
    value = "TEXT named_metrics.kv_cache_usage_perc=0.25, named_metrics.num_requests_waiting=2.0"
    assert parse_orca({H: value}) == {
        "named_metrics.kv_cache_usage_perc": 0.25,
        "named_metrics.num_requests_waiting": 2.0,
    }


def test_text_empty_body_is_an_empty_report() -> None:
    assert parse_orca({H: "TEXT "}) == {}
    assert parse_orca({H: "TEXT"}) == {}


def test_text_top_level_zero_means_not_reported_as_in_protobuf() -> None:
    assert parse_orca({H: "TEXT cpu_utilization=0, named_metrics.x=0"}) == {"named_metrics.x": 0.0}


def test_text_names_may_contain_dots_after_the_field() -> None:
    assert parse_orca({H: "TEXT named_metrics.a.b=1"}) == {"named_metrics.a.b": 1.0}


# -- JSON --------------------------------------------------------------------------------


def test_json_round_trip_of_a_real_report() -> None:
    assert parse_orca({H: "JSON " + json_format.MessageToJson(full_report())}) == FULL


def test_json_with_original_field_names_as_vllm_sends_it() -> None:
    value = 'JSON {"named_metrics": {"kv_cache_usage_perc": 0.5, "num_requests_waiting": 1}}'
    assert parse_orca({H: value}) == {
        "named_metrics.kv_cache_usage_perc": 0.5,
        "named_metrics.num_requests_waiting": 1.0,
    }


# -- BIN and -bin ------------------------------------------------------------------------


def test_bin_prefix_round_trip() -> None:
    assert parse_orca({H: "BIN " + b64(full_report())}) == FULL


@pytest.mark.parametrize("pad", [True, False])
def test_bin_header_round_trip_padded_or_not(pad: bool) -> None:
    report = OrcaLoadReport(cpu_utilization=0.5, named_metrics={"a": 1.0})
    assert parse_orca({HBIN: b64(report, pad=pad)}) == {
        "cpu_utilization": 0.5,
        "named_metrics.a": 1.0,
    }


def test_empty_report_is_empty() -> None:
    assert parse_orca({HBIN: ""}) == {}
    assert report_to_dict(OrcaLoadReport()) == {}


def test_deprecated_integer_rps_is_ignored() -> None:
    assert parse_orca({HBIN: b64(OrcaLoadReport(rps=7, eps=1.0))}) == {"eps": 1.0}


# -- garbage -----------------------------------------------------------------------------

NAN = b64(OrcaLoadReport(cpu_utilization=math.nan))
INF_NAMED = b64(OrcaLoadReport(named_metrics={"x": math.inf}))
EMPTY_NAME = b64(OrcaLoadReport(utilization={"": 0.5}))


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        ({H: ""}, "must start with"),
        ({H: "cpu_utilization=0.5"}, "must start with"),
        ({H: "text cpu_utilization=0.5"}, "must start with"),
        ({H: "XML <a/>"}, "must start with"),
        ({H: "TEXT cpu_utilization"}, "is not key=value"),
        ({H: "TEXT =0.5"}, "empty key"),
        ({H: "TEXT cpu_utilization=0.5,,eps=1"}, "entry 2 is empty"),
        ({H: "TEXT cpu_utilization=0.5,"}, "entry 2 is empty"),
        ({H: "TEXT cpu_utilization=high"}, "not a finite number"),
        ({H: "TEXT cpu_utilization="}, "not a finite number"),
        ({H: "TEXT cpu_utilization=1_000"}, "not a finite number"),
        ({H: "TEXT cpu_utilization=0x10"}, "not a finite number"),
        ({H: "TEXT cpu_utilization=nan"}, "not a finite number"),
        ({H: "TEXT eps=inf"}, "not a finite number"),
        ({H: "TEXT eps=-Infinity"}, "not a finite number"),
        ({H: "TEXT eps=1e999"}, "must be finite"),
        ({H: "TEXT rps=5"}, "unknown key 'rps'"),
        ({H: "TEXT gpu_utilization=0.5"}, "unknown key"),
        ({H: "TEXT custom.gpu=0.5"}, "unknown key 'custom.gpu'"),
        ({H: "TEXT named_metrics.=0.5"}, "empty name"),
        ({H: "TEXT eps=1, eps:2"}, "duplicate key 'eps'"),
        ({H: "JSON"}, "JSON is not an OrcaLoadReport"),
        ({H: "JSON {not json"}, "JSON is not an OrcaLoadReport"),
        ({H: "JSON [1, 2]"}, "JSON is not an OrcaLoadReport"),
        ({H: 'JSON {"gpuUtilization": 0.5}'}, "JSON is not an OrcaLoadReport"),
        ({H: 'JSON {"namedMetrics": {"a": "lots"}}'}, "JSON is not an OrcaLoadReport"),
        ({H: 'JSON {"cpuUtilization": "NaN"}'}, "must be finite"),
        ({H: 'JSON {"namedMetrics": {"a": "Infinity"}}'}, "must be finite"),
        ({H: "BIN !!not base64!!"}, "not valid base64"),
        ({H: "BIN " + base64.b64encode(b"\x09\x00").decode()}, "not a serialized OrcaLoadReport"),
        ({HBIN: "@@@@"}, "not valid base64"),
        ({HBIN: "A"}, "not valid base64"),
        ({HBIN: base64.b64encode(b"\xff\xff\xff").decode()}, "not a serialized OrcaLoadReport"),
        ({HBIN: NAN}, "must be finite"),
        ({HBIN: INF_NAMED}, "must be finite"),
        ({HBIN: EMPTY_NAME}, "utilization has an entry with an empty name"),
        ({H: "TEXT eps=1", HBIN: b64(OrcaLoadReport(eps=1.0))}, "both"),
    ],
)
def test_garbage_raises_a_precise_error(headers: dict[str, str], message: str) -> None:
    with pytest.raises(OrcaParseError, match=message.replace("(", r"\(")) as info:
        parse_orca(headers)
    assert isinstance(info.value, ValueError)


# -- merge_orca --------------------------------------------------------------------------


def test_merge_maps_vllm_named_metrics_onto_common_fields() -> None:
    report = {
        "named_metrics.kv_cache_usage_perc": 0.4,
        "named_metrics.num_requests_waiting": 3.0,
        "named_metrics.num_requests_running": 5.0,
        "cpu_utilization": 0.9,
    }
    merged = merge_orca(None, report, now=12.0)
    assert merged == EndpointMetrics(
        updated_at=12.0, waiting=3.0, running=5.0, kv_usage=0.4, orca=report
    )


def test_merge_keeps_what_the_report_does_not_carry() -> None:
    previous = EndpointMetrics(
        updated_at=1.0,
        waiting=7.0,
        running=2.0,
        kv_usage=0.9,
        lora_running=frozenset({"a"}),
        lora_waiting=frozenset({"b"}),
        max_lora=4,
        block_size=16,
        num_blocks=1000,
        orca={"eps": 1.0},
    )
    merged = merge_orca(previous, {"named_metrics.kv_cache_usage_perc": 0.1}, now=5.0)
    assert merged.updated_at == 5.0
    assert merged.kv_usage == 0.1
    assert merged.orca == {"named_metrics.kv_cache_usage_perc": 0.1}  # replaced, not merged
    assert (merged.waiting, merged.running) == (7.0, 2.0)
    assert (merged.lora_running, merged.lora_waiting) == (frozenset({"a"}), frozenset({"b"}))
    assert (merged.max_lora, merged.block_size, merged.num_blocks) == (4, 16, 1000)
    assert previous.kv_usage == 0.9  # the old value object is untouched


def test_merge_copies_the_report() -> None:
    report = {"named_metrics.num_requests_running": 1.0}
    merged = merge_orca(None, report, now=0.0)
    report["named_metrics.num_requests_running"] = 99.0
    assert merged.running == 1.0 and merged.orca == {"named_metrics.num_requests_running": 1.0}
    assert (merged.waiting, merged.kv_usage) == (None, None)


# -- property: BIN round trip ------------------------------------------------------------

finite = st.floats(allow_nan=False, allow_infinity=False)
names = st.text(min_size=1, max_size=12)
maps = st.dictionaries(names, finite, max_size=4)


@given(
    scalars=st.fixed_dictionaries(
        {},
        optional={
            k: finite
            for k in (
                "cpu_utilization",
                "mem_utilization",
                "application_utilization",
                "rps_fractional",
                "eps",
            )
        },
    ),
    named=maps,
    utilization=maps,
    cost=maps,
    use_bin_header=st.booleans(),
)
def test_any_finite_report_survives_bin_round_trip(
    scalars: dict[str, float],
    named: dict[str, float],
    utilization: dict[str, float],
    cost: dict[str, float],
    use_bin_header: bool,
) -> None:
    report = OrcaLoadReport(
        named_metrics=named, utilization=utilization, request_cost=cost, **scalars
    )
    expected = {k: v for k, v in scalars.items() if v != 0}
    expected.update({f"named_metrics.{k}": v for k, v in named.items()})
    expected.update({f"utilization.{k}": v for k, v in utilization.items()})
    expected.update({f"request_cost.{k}": v for k, v in cost.items()})
    headers = {HBIN: b64(report)} if use_bin_header else {H: "BIN " + b64(report)}
    assert parse_orca(headers) == expected
    # and JSON carries the same values
    assert parse_orca({H: "JSON " + json_format.MessageToJson(report)}) == expected
