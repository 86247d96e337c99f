"""bench.fairness_model: bench.fairness's two tenants on the virtual clock, through the
real router and flow control."""

from __future__ import annotations

import math

import pytest

from bench.fairness import capacity_of
from bench.fairness_model import build_parser, make_setting, oracle_waits, scenario
from bench.routing_model import parse_model_policy
from bench.virtualtime import run_virtual


def test_flow_control_serves_the_light_tenant_ahead_of_the_flood() -> None:
    args = build_parser().parse_args(["--duration", "2", "--warmup", "1"])
    args.flood = 24
    setting = make_setting(args.servers, args.slots)
    rate_b = 0.2 * capacity_of(args.servers, args.slots, args.tokens)[1]
    rows = {
        spec: run_virtual(scenario(setting, parse_model_policy(spec), args, True, rate_b))
        for spec in ("on=configs/flow-control.yaml", "off=configs/flow-control-off.yaml")
    }
    on, off = rows["on=configs/flow-control.yaml"], rows["off=configs/flow-control-off.yaml"]
    assert on["errors"] == off["errors"] == 0 and on["b_done"] == off["b_done"] > 0
    # B waits for the next free slot, not behind A's requests in the servers' queues
    assert on["b_ttft_p90_ms"] < off["b_ttft_p90_ms"] / 2
    assert on["total_rps"] > 0.9 * off["total_rps"]


def test_the_floor_takes_the_first_slot_freed_that_no_earlier_arrival_took() -> None:
    waits = oracle_waits([1.0, 1.1, 1.2, 5.0], [0.5, 1.5, 1.5, 2.0])
    assert waits[:3] == pytest.approx([0.5, 0.4, 0.8]) and math.isnan(waits[3])
