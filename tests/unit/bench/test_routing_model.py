"""bench.routing_model: the real scheduler and simulator engine on a virtual clock."""

from __future__ import annotations

import asyncio

import pytest

from bench.routing import Cell, Record
from bench.routing_model import (
    ModelPolicy,
    Setting,
    build_parser,
    build_pool,
    make_setting,
    parse_model_policy,
    ratio_table,
    run_cell,
    run_seed,
)
from bench.virtualtime import run_virtual
from epp_harness.sim.protocol import ApiKind, parse_request

ARGS = ["--servers", "2", "--groups", "2", "--skew", "0", "--duration", "3", "--warmup", "0"]
ARGS += ["--capacity", "10", "--loads", "0.5", "--seeds", "1"]


def records(setting: Setting, policy: ModelPolicy, cell: Cell) -> list[Record]:
    async def go() -> list[Record]:
        pool = build_pool(setting, policy)
        try:
            return await run_cell(pool, setting, policy, cell)
        finally:
            pool.stop = True
            for task in pool.scrapes:
                task.cancel()
            await asyncio.gather(*pool.scrapes, return_exceptions=True)

    return run_virtual(go())


def test_a_lone_request_costs_exactly_its_hop_and_prefill() -> None:
    args = build_parser().parse_args(ARGS)
    setting = make_setting(args)
    cell = setting.workload.cell(1.0, 3.0, 1)
    del cell.requests[1:]
    (rec,) = records(setting, parse_model_policy("round-robin"), cell)
    req = parse_request(
        ApiKind.CHAT, cell.requests[0].data, served_model="sim-model", default_max_tokens=1
    )
    sim = setting.sim
    prefill_s = (sim.prefill_overhead_ms + sim.prefill_ms_per_token * req.prompt_tokens) / 1000
    assert rec.cached_tokens == 0
    assert rec.ttft_s == pytest.approx(setting.hop_s + prefill_s, abs=1e-9)
    assert rec.e2e_s is not None and rec.e2e_s > rec.ttft_s


def test_the_scheduler_keeps_a_group_where_it_is_cached() -> None:
    args = build_parser().parse_args(ARGS)
    setting = make_setting(args)
    cell = setting.workload.cell(2.0, 3.0, 1)
    recs = records(setting, parse_model_policy("default="), cell)
    servers: dict[int, set[str]] = {}
    for r in recs:
        servers.setdefault(r.group, set()).add(r.server)
    assert all(len(s) == 1 for s in servers.values())  # low load: one home per group

    def warm(i: int, r: Record) -> bool:  # an earlier request of its group had prefilled
        return any(q.group == r.group and q.due + (q.ttft_s or 9) < r.due for q in recs[:i])

    later = [r for i, r in enumerate(recs) if warm(i, r)]
    assert later and all((r.cached_tokens or 0) >= 1488 for r in later)


def test_runs_are_deterministic() -> None:
    args = build_parser().parse_args(ARGS)
    setting = make_setting(args)
    policies = [parse_model_policy(p) for p in ("round-robin", "default=", "ideal-split")]
    first = run_seed(setting, policies, args.loads, args, 1)
    second = run_seed(make_setting(args), policies, args.loads, args, 1)
    assert first == second
    assert [r["policy"] for r in first[1]] == ["round-robin", "default", "ideal-split"]


def test_ratio_tables_divide_seed_by_seed_and_skip_a_missing_reference() -> None:
    rows = [
        {"policy": "round-robin", "load": 0.4, "seed": 1, "hit": 0.5},
        {"policy": "round-robin", "load": 0.4, "seed": 2, "hit": 0.25},
        {"policy": "ideal", "load": 0.4, "seed": 1, "hit": 1.0},
        {"policy": "ideal", "load": 0.4, "seed": 2, "hit": 0.0},
    ]
    lines = ratio_table(rows, [1, 2], ["round-robin", "ideal"], [0.4], "hit", "hits", "ideal")
    assert lines[0] == "## hits (mean of per-seed ratios)"
    # seed 2's reference is 0: only seed 1 counts
    assert lines[4:6] == ["| round-robin | 0.50x |", "| ideal | 1.00x |"]
