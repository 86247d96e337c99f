"""``epp sim`` flags: defaults, validation, and the config they build."""

from __future__ import annotations

import argparse

import pytest

from epp.observability.logsetup import level_of
from epp.types import Role
from epp_harness.sim.config import KvConnector, address
from epp_harness.sim.flags import add_arguments, config_from_args


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="epp sim")
    add_arguments(parser)
    return parser.parse_args(argv)


def test_defaults() -> None:
    args = parse()
    assert (args.host, args.port, args.model, args.ready_file) == (
        "127.0.0.1",
        8000,
        "sim-model",
        None,
    )
    assert (args.max_num_seqs, args.kv_blocks, args.block_size) == (16, 8192, 16)
    assert (args.prefill_overhead_ms, args.prefill_ms_per_token) == (5.0, 0.05)
    assert (args.decode_ms_per_token, args.itl_ms_per_running_seq) == (8.0, 0.5)
    assert (args.default_max_tokens, args.time_scale, level_of(args)) == (16, 1.0, "info")


def test_config_from_args_uses_the_bound_port_for_the_instance_id() -> None:
    config = config_from_args(parse("--port", "0", "--time-scale", "0"), 41234)
    assert (config.port, config.instance_id, config.time_scale) == (41234, "127.0.0.1:41234", 0)
    named = config_from_args(parse("--instance-id", "pod-a", "--model", "m"), 1)
    assert (named.instance_id, named.model) == ("pod-a", "m")


def test_disaggregation_flags() -> None:
    args = parse()
    assert (args.role, args.kv_connector, args.kv_pool_dir, args.bootstrap_port) == (
        Role.BOTH,
        "nixl",
        None,
        None,
    )
    assert (args.kv_hold_seconds, args.bootstrap_timeout_seconds) == (30.0, 10.0)
    assert args.kv_transfer_ms_per_token == 0.005
    config = config_from_args(
        parse(
            "--role", "Prefill", "--kv-connector", "MOONCAKE", "--bootstrap-port", "0",
            "--kv-hold-seconds", "2", "--bootstrap-timeout-seconds", "0.5",
            "--kv-transfer-ms-per-token", "0.01",
        ),
        9000,
    )  # fmt: skip
    assert (config.role, config.kv_connector, config.bootstrap_port) == (
        Role.PREFILL,
        KvConnector.MOONCAKE,
        0,
    )
    assert (config.kv_hold_seconds, config.bootstrap_timeout_seconds) == (2.0, 0.5)
    assert config.kv_transfer_ms_per_token == 0.01
    assert parse("--role", "both").role is Role.BOTH  # llm-d's older spelling
    pool = config_from_args(parse("--kv-connector", "pool", "--kv-pool-dir", "/tmp/p"), 1)
    assert (pool.kv_connector, pool.kv_pool_dir) == (KvConnector.POOL, "/tmp/p")


def test_flag_combinations_that_make_no_sense_are_rejected() -> None:
    with pytest.raises(ValueError, match="--kv-pool-dir"):
        config_from_args(parse("--kv-connector", "pool"), 1)
    with pytest.raises(ValueError, match="--bootstrap-port"):
        config_from_args(parse("--bootstrap-port", "9"), 1)


def test_ipv6_addresses_are_bracketed() -> None:
    assert address("::1", 80) == "[::1]:80"
    assert address("10.0.0.1", 80) == "10.0.0.1:80"


@pytest.mark.parametrize(
    "argv",
    [
        ("--port", "-1"),
        ("--port", "65536"),
        ("--max-num-seqs", "0"),
        ("--kv-blocks", "-5"),
        ("--block-size", "x"),
        ("--default-max-tokens", "0"),
        ("--prefill-overhead-ms", "-1"),
        ("--prefill-ms-per-token", "-0.1"),
        ("--decode-ms-per-token", "nan"),
        ("--itl-ms-per-running-seq", "inf"),
        ("--time-scale", "-2"),
        ("--role", "router"),
        ("--kv-connector", "rdma"),
        ("--kv-hold-seconds", "-1"),
        ("--bootstrap-timeout-seconds", "inf"),
        ("--kv-transfer-ms-per-token", "x"),
        ("--bootstrap-port", "70000"),
    ],
)
def test_invalid_values_are_argparse_errors(
    argv: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        parse(*argv)
    assert info.value.code == 2
    assert argv[0] in capsys.readouterr().err
