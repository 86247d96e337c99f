"""bench/routing.py's pure parts: pinned simulator flags, usage parsing, policies."""

from __future__ import annotations

import argparse

import orjson
import pytest

from bench.routing import SimSettings, cached_tokens, final_usage, parse_policy
from epp_harness.sim.config import SimConfig
from epp_harness.sim.engine import Engine
from epp_harness.sim.flags import add_arguments, config_from_args

# max_num_seqs, kv_blocks, block_size, then the latency model's four numbers
SIM = SimSettings(4, 1026, 16, 5.0, 0.1, 8.0, 0.5)


def test_every_pinned_setting_reaches_the_simulator_config() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    config = config_from_args(parser.parse_args(SIM.argv()), port=1)
    for name, value in SIM.__dict__.items():
        assert getattr(config, name) == value, name
    assert "--enable-prompt-tokens-details" in SIM.argv() and "--time-scale=1.0" in SIM.argv()


def test_the_baselines_keep_per_request_timing() -> None:
    """The simulator batches steps by default; bench.routing's committed baselines were
    measured without that interference, and its pinned flags keep it off."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    config = config_from_args(parser.parse_args(SIM.argv()), port=1)
    assert "--max-num-batched-tokens=0" in SIM.argv()
    assert SimConfig().max_num_batched_tokens > 0
    assert Engine(config).steps is None


def test_cached_tokens_from_the_final_usage_chunk() -> None:
    def tail(usage: object) -> bytes:
        chunk = {"choices": [], "usage": usage}
        return (
            b'data: {"choices":[{"text":"x"}]}\n\ndata: '
            + orjson.dumps(chunk)
            + (b"\n\ndata: [DONE]\n\n")
        )

    hit = final_usage(tail({"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": 8}}))
    assert cached_tokens(hit) == 8
    # vLLM leaves the details null when nothing was cached
    miss = final_usage(tail({"prompt_tokens": 10, "prompt_tokens_details": None}))
    assert cached_tokens(miss) == 0
    assert final_usage(b"data: [DONE]\n\n") == {} and cached_tokens({}) is None


def test_ideal_and_round_robin_take_no_epp_args() -> None:
    ideal = parse_policy("ideal")
    assert ideal.oracle and ideal.epp_args is None and "ORIGINAL_DST" in ideal.describe()
    assert parse_policy("ideal-split").oracle == "ideal-split"
    assert parse_policy("round-robin").oracle is None
    assert parse_policy("default=").epp_args == ()
    with pytest.raises(argparse.ArgumentTypeError):
        parse_policy("ideal=--config x.yaml")


@pytest.mark.parametrize(
    "spec",
    ["two=--replicas 2 --config c.yaml", "two=--config c.yaml --replicas=2"],
)
def test_replicas_are_taken_out_of_the_epp_args(spec: str) -> None:
    policy = parse_policy(spec)
    assert (policy.replicas, policy.epp_args) == (2, ("--config", "c.yaml"))
    assert "2 replicas of `epp serve --config c.yaml`" in policy.describe()
    assert parse_policy("one=--config c.yaml").replicas == 1


@pytest.mark.parametrize("spec", ["x=--replicas", "x=--replicas 0", "x=--replicas=two"])
def test_a_bad_replica_count_is_refused(spec: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="--replicas"):
        parse_policy(spec)


def test_the_report_gives_each_replica_its_share_of_the_requests() -> None:
    from bench.routing_report import replica_shares

    rows = [
        {"policy": "one", "rate": 10.0, "replica_requests": [40]},
        {"policy": "two", "rate": 10.0, "replica_requests": [30, 10]},
    ]
    (blank, line) = replica_shares(rows)
    assert blank == "" and line.endswith("two at 10 req/s 75%/25%.")
    assert replica_shares(rows[:1]) == []
