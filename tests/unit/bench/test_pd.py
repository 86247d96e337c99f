"""bench/pd.py's pure parts: the workload plan, the capacity estimate, the per-cell
summary (goodput), the EPP configs and the deployments it runs."""

from __future__ import annotations

import orjson
import pytest

from bench import pd_report
from bench.pd import (
    SIM,
    WORKLOADS,
    Record,
    build_parser,
    capacity,
    deployments,
    epp_config,
    plan,
    summarize,
)
from epp.config import build_scheduler


def test_the_plan_is_seeded_open_loop_and_every_prompt_is_unique() -> None:
    mixed = next(w for w in WORKLOADS if w.name == "mixed")
    a, b = plan(mixed, 20.0, 10.0, seed=3), plan(mixed, 20.0, 10.0, seed=3)
    assert [p.data for p in a] == [p.data for p in b]
    assert 120 < len(a) < 280  # Poisson at 20/s for 10 s
    assert all(0 < p.offset_s < 10 for p in a)
    prompts = [orjson.loads(p.data)["prompt"] for p in a]
    assert len({t[:40] for t in prompts}) == len(prompts)  # unique from the first block
    long = [p for p in a if p.prompt_tokens >= 3000]
    assert 0.1 < len(long) / len(a) < 0.45  # a quarter of the mix
    for p in a:
        body = orjson.loads(p.data)
        assert len(body["prompt"]) == 4 * p.prompt_tokens and body["max_tokens"] == p.max_tokens
        assert body["stream"] is True


def test_capacity_counts_prefill_compute_and_a_share_of_full_decode_steps() -> None:
    decode = next(w for w in WORKLOADS if w.name == "decode-heavy")
    step = SIM["decode-ms-per-token"] + SIM["itl-ms-per-running-seq"] * SIM["max-num-seqs"]
    per_request_ms = 5 + 0.05 * 200 + 225 * step / SIM["max-num-seqs"]
    assert capacity(decode, 4) == pytest.approx(4000 / per_request_ms)


def test_goodput_needs_both_the_ttft_and_the_requests_own_itl() -> None:
    fast = Record(4, ttft_s=0.1, e2e_s=0.2, gaps_s=[0.01, 0.01, 0.01], tokens=4)
    slow_start = Record(4, ttft_s=2.0, e2e_s=2.1, gaps_s=[0.01] * 3, tokens=4)
    stalled = Record(4, ttft_s=0.1, e2e_s=0.5, gaps_s=[0.01, 0.2, 0.2], tokens=4)
    failed = Record(4, error="http-503")
    row = summarize([fast, slow_start, stalled, failed], 2.0, 1.0, 1500, 50)
    assert row["goodput"] == 0.25
    assert (row["requests"], row["ok"], row["errors"]) == (4, 3, {"http-503": 1})
    assert row["ttft_p50_ms"] == 100.0 and row["itl_p99_ms"] == 200.0
    assert row["throughput_rps"] == 1.5
    # simulated time: at --time-scale 2 every wall time counts half
    assert summarize([fast], 2.0, 2.0, 1500, 50)["ttft_p50_ms"] == 50.0


@pytest.mark.parametrize("decider", ["always", "never", "prefix-based", "benefit", "benefit:0.25"])
def test_every_decider_config_is_one_the_epp_accepts(decider: str) -> None:
    text = orjson.dumps(epp_config(decider, 1.0)).decode()
    scheduler = build_scheduler(text)
    assert scheduler is not None


def test_benefit_w_sets_the_stall_weight_and_bad_spellings_are_refused() -> None:
    args = build_parser().parse_args(["--deciders", "benefit:0.25", "never"])
    assert args.deciders == ["benefit:0.25", "never"]
    (handler,) = [
        p for p in epp_config("benefit:0.25", 1.0)["plugins"] if p["type"] == "pd-profile-handler"
    ]
    assert handler["parameters"]["decider"] == "benefit"
    assert handler["parameters"]["stallWeight"] == 0.25
    for bad in ("benefit:x", "benefit:-1", "never:2", "sometimes"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["--deciders", bad])


def test_the_default_matrix() -> None:
    names = [d.name for d in deployments(build_parser().parse_args([]))]
    assert names == [
        "aggregated",
        "1P:3D nixl",
        "1P:3D sidecar",
        "2P:2D nixl",
        "2P:2D sidecar",
        "1P:3D nixl never",
        "1P:3D nixl prefix-based",
        "1P:3D nixl benefit",
    ]


@pytest.mark.parametrize(
    ("defer", "splits"),
    [
        ("on", ["1P:3D nixl deferred", "1P:3D sidecar"]),
        ("both", ["1P:3D nixl", "1P:3D nixl deferred", "1P:3D sidecar"]),
    ],
)
def test_deferral_adds_splits_of_the_coordinators_that_can_defer(
    defer: str, splits: list[str]
) -> None:
    args = build_parser().parse_args(
        ["--ratios", "1:3", "--deciders", "always", "--defer-decode", defer]
    )
    deps = deployments(args)
    assert [d.name for d in deps] == ["aggregated", *splits]
    assert [d.defer for d in deps] == [name.endswith("deferred") for name in ["", *splits]]
    deferred = next(d for d in deps if d.defer)
    doc = epp_config(deferred.decider, 1.0, deferred.defer)
    assert doc["disaggregation"] == {"deferDecode": True}
    assert build_scheduler(orjson.dumps(doc).decode()) is not None


def test_the_reading_judges_the_best_split_and_the_deciders() -> None:
    def row(dep: str, wl: str, itl: float, ttft: float, goodput: float) -> dict[str, object]:
        return {
            "deployment": dep, "workload": wl, "load": 0.7, "itl_p99_ms": itl,
            "ttft_p90_ms": ttft, "goodput": goodput,
        }  # fmt: skip

    args = build_parser().parse_args(["--loads", "0.7"])
    meta = {
        "loads": [0.7],
        "decider_ratio": "1:3",
        "deployments": [d.__dict__ for d in deployments(args)],
        "workloads": {"mixed": []},
        "slo": {"ttft_ms": 1500, "itl_ms": 50},
    }
    rows = [
        row("aggregated", "mixed", 100, 300, 0.5),
        row("1P:3D nixl", "mixed", 20, 900, 0.6),  # low ITL, TTFT too slow
        row("2P:2D nixl", "mixed", 40, 330, 0.7),  # meets both
        row("1P:3D nixl never", "mixed", 100, 300, 0.5),
        row("1P:3D nixl benefit", "mixed", 30, 320, 0.6),
    ]
    text = "\n".join(pd_report.reading(meta, rows))
    assert "`2P:2D nixl`" in text and "(0.4x" in text and "**met**" in text
    assert "mixed: met at every load" in text
