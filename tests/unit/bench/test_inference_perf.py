"""bench.inference_perf's pure parts: the config it hands inference-perf and the rows it
reads back from inference-perf's per-stage reports."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import inference_perf, inference_perf_report


def summary(mean: float, median: float, p90: float) -> dict[str, float]:
    return {"mean": mean, "median": median, "p90": p90}


STAGE = {
    "load_summary": {"requested_rate": 5.0, "achieved_rate": 4.9},
    "successes": {
        "count": 48,
        "latency": {
            "time_to_first_token": summary(0.1, 0.08, 0.2),
            "inter_token_latency": summary(0.009, 0.008, 0.01),
        },
        "throughput": {"requests_per_sec": 4.8, "output_tokens_per_sec": 153.6},
        "prompt_tokens": {"total": 79200.0, "cached": 59400.0, "uncached": 19800.0},
        "token_count_mismatches": 0,
    },
    "failures": {"count": 2},
}


def test_a_stage_report_becomes_a_row() -> None:
    row = inference_perf_report.row("default", STAGE)
    assert row["kv_cache_hit_pct"] == pytest.approx(75.0)
    assert (row["ttft_mean_ms"], row["ttft_p50_ms"], row["ttft_p90_ms"]) == pytest.approx(
        (100.0, 80.0, 200.0)
    )
    assert (row["successes"], row["failures"], row["rate"]) == (48, 2, 5.0)
    assert row["token_count_mismatches"] == 0


def test_a_stage_without_a_report_gives_empty_cells() -> None:
    rows = inference_perf_report.rows({"round-robin": [{}], "default": [STAGE]})
    lines = inference_perf_report.table(rows)
    assert len(lines) == 4 and lines[2].startswith(f"| round-robin | {inference_perf_report.NONE}")
    assert "| default | 5.0 | 4.90 | 48 | 2 | 75.0 | 100 | 80 | 200 |" in lines[3]


def test_the_config_asks_for_shared_prefix_at_each_rate() -> None:
    args = inference_perf.build_parser().parse_args(["--rates", "9", "5", "--duration", "10"])
    args.rates = sorted(args.rates)
    config = inference_perf.iperf_config(args, "http://h:1", Path("tok"), Path("out"))
    assert config["data"]["shared_prefix"] == {
        "num_groups": 16,
        "num_prompts_per_group": 32,
        "system_prompt_len": 1500,
        "question_len": 150,
        "output_len": 32,
    }
    assert config["load"]["type"] == "poisson"
    assert config["load"]["stages"] == [
        {"rate": 5.0, "duration": 10},
        {"rate": 9.0, "duration": 10},
    ]
    assert config["api"] == {"type": "completion", "streaming": True}
    assert config["tokenizer"] == {"pretrained_model_name_or_path": "tok"}


def test_without_inference_perf_it_says_so_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert inference_perf.main(["--iperf", str(tmp_path / "none")]) == 2
    assert "make bench-inference-perf" in capsys.readouterr().err
