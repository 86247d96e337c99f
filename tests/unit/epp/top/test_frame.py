"""`epp top`'s numbers (epp.top.frame) from plain /status documents and /metrics text,
and one rendered screen (epp.top.render) as text."""

from __future__ import annotations

from typing import Any

import pytest
from rich.console import Console

from epp.top.frame import Sample, frame, parse_exposition
from epp.top.render import render

A, B = "10.0.0.1:8000", "10.0.0.2:8000"


def status(hits_a: float, queried_a: float, in_flight_a: int = 2) -> dict[str, Any]:
    return {
        "endpoints": [
            {
                "instance": A,
                "type": "decode",
                "state": "healthy",
                "in_flight": in_flight_a,
                "load": {
                    "waiting": 1.0,
                    "running": 3.0,
                    "kv_cache_usage": 0.42,
                    "prefix_cache": {"queried_tokens": queried_a, "hit_tokens": hits_a},
                },
            },
            {"instance": B, "type": "prefill", "state": "ejected", "in_flight": 0},
        ]
    }


def metrics(ok_a: int, failed_a: int, routed: int, rejected: int, ttft: list[int]) -> str:
    """Exposition text; ``ttft``: cumulative counts of the buckets 0.1, 0.5, 1, +Inf."""
    buckets = "".join(
        f'llm_d_epp_request_ttft_seconds_bucket{{le="{le}",model_name="m"}} {n}\n'
        for le, n in zip(("0.1", "0.5", "1.0", "+Inf"), ttft, strict=True)
    )
    return (
        "# TYPE epp_responses_total counter\n"
        f'epp_responses_total{{endpoint="{A}",status_class="2xx"}} {ok_a}\n'
        f'epp_responses_total{{endpoint="{A}",status_class="5xx"}} {failed_a}\n'
        "# TYPE epp_requests_total counter\n"
        f'epp_requests_total{{outcome="routed"}} {routed}\n'
        f'epp_requests_total{{outcome="429"}} {rejected}\n'
        "# TYPE epp_scheduling_duration_seconds histogram\n"
        f"epp_scheduling_duration_seconds_count {routed}\n"
        f"epp_scheduling_duration_seconds_sum {routed * 0.0002}\n"
        "# TYPE llm_d_epp_request_ttft_seconds histogram\n"
        f"{buckets}"
    )


def sample(at: float, doc: dict[str, Any], text: str) -> Sample:
    return Sample(at, doc, parse_exposition(text))


FIRST = sample(10.0, status(100, 1000), metrics(10, 0, 12, 0, [0, 0, 0, 0]))
SECOND = sample(12.0, status(700, 2000), metrics(30, 4, 40, 2, [2, 10, 20, 20]))


def test_rates_are_counter_deltas_over_the_window() -> None:
    f = frame(FIRST, SECOND)
    assert f.window_s == 2.0
    a, b = f.endpoints
    assert (a.address, a.role, a.state, a.in_flight) == (A, "decode", "healthy", 2)
    assert (a.waiting, a.running, a.kv_usage) == (1.0, 3.0, 0.42)
    assert a.rate == pytest.approx(12.0)  # (30 + 4 - 10) / 2
    assert a.errors == pytest.approx(2.0)  # the 4 non-2xx
    assert a.hit_rate == pytest.approx(0.6)  # 600 hit of 1000 queried tokens
    # B: no responses counted yet, no load reported, no prefix-cache counters
    assert (b.rate, b.errors, b.waiting, b.hit_rate) == (0.0, 0.0, None, None)
    pool = f.pool
    assert (pool.endpoints, pool.healthy, pool.in_flight) == (2, 1, 2)
    assert pool.rate == pytest.approx(15.0)  # (40 + 2 - 12) / 2
    assert pool.errors == pytest.approx(1.0)  # the EPP's own 429s
    assert pool.scheduling_ms == pytest.approx(0.2)


def test_ttft_p90_interpolates_inside_its_bucket() -> None:
    # 20 observations: 2 below 0.1 s, 8 in (0.1, 0.5], 10 in (0.5, 1]; the 18th is
    # the 8th of the 10 in the last finite bucket
    assert frame(FIRST, SECOND).pool.ttft_p90_s == pytest.approx(0.5 + 0.5 * 8 / 10)


def test_a_first_sample_alone_has_load_but_no_rates() -> None:
    f = frame(None, FIRST)
    a = f.endpoints[0]
    assert (a.waiting, a.in_flight) == (1.0, 2)
    assert (a.rate, a.hit_rate, f.pool.rate, f.pool.ttft_p90_s, f.window_s) == (
        None,
        None,
        None,
        None,
        None,
    )


def test_a_counter_that_went_down_gives_no_rate() -> None:
    """The EPP restarted between the samples: its counters started over."""
    restarted = sample(14.0, status(5, 10), metrics(1, 0, 1, 0, [0, 0, 0, 0]))
    f = frame(SECOND, restarted)
    assert (f.endpoints[0].rate, f.endpoints[0].hit_rate, f.pool.rate) == (None, None, None)
    assert f.pool.ttft_p90_s is None  # nothing observed in the window


def test_no_queries_in_the_window_gives_no_hit_rate() -> None:
    later = sample(14.0, status(700, 2000), metrics(30, 4, 40, 2, [2, 10, 20, 20]))
    assert frame(SECOND, later).endpoints[0].hit_rate is None


def test_the_screen_shows_the_pool_line_and_a_row_per_endpoint() -> None:
    console = Console(width=120, record=True, color_system=None)
    console.print(render(frame(FIRST, SECOND), "http://127.0.0.1:9090", "q quits"))
    text = console.export_text()
    assert "http://127.0.0.1:9090  (rates over 2.0 s)" in text
    assert "endpoints 2 (1 healthy)" in text and "requests 15.0/s" in text
    assert "TTFT p90 900 ms" in text and "scheduling 0.20 ms (mean)" in text
    row_a = next(line for line in text.splitlines() if line.startswith(A))
    assert row_a.split() == [A, "decode", "healthy", "1", "3", "42%", "2", "12.0", "2.0", "60%"]
    row_b = next(line for line in text.splitlines() if line.startswith(B))
    assert row_b.split() == [B, "prefill", "ejected", "-", "-", "-", "0", "0.0", "0.0", "-"]
    assert text.rstrip().endswith("q quits")
