"""Reading P/D handoff fields from request bodies (NIXL kv_transfer_params, SGLang
bootstrap fields) and building the params a NIXL prefill returns."""

from __future__ import annotations

from typing import Any

import pytest

from epp_harness.sim.kv_params import (
    Bootstrap,
    NixlLeg,
    RemotePrefill,
    nixl_source_params,
    parse_bootstrap,
    parse_nixl,
)
from epp_harness.sim.protocol import SimError

SOURCE = nixl_source_params("engine-1", [4, 5, 6], "10.0.0.7", 8000)


def test_returned_params_name_the_source() -> None:
    assert SOURCE == {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_engine_id": "engine-1",
        "remote_block_ids": [4, 5, 6],
        "remote_host": "10.0.0.7",
        "remote_port": 8000,
        "tp_size": 1,
    }


def test_returned_params_parse_back_into_a_pull_source() -> None:
    leg = parse_nixl({"kv_transfer_params": SOURCE})
    assert leg == NixlLeg(source=RemotePrefill("engine-1", (4, 5, 6), "10.0.0.7", 8000))
    assert leg is not None and leg.source is not None
    assert leg.source.address == "10.0.0.7:8000"
    ipv6 = parse_nixl({"kv_transfer_params": {**SOURCE, "remote_host": "::1"}})
    assert ipv6 is not None and ipv6.source is not None and ipv6.source.address == "[::1]:8000"


def test_prefill_leg_and_plain_requests() -> None:
    prefill = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None}
    assert parse_nixl({"kv_transfer_params": prefill}) == NixlLeg(remote_decode=True)
    assert parse_nixl({}) is None
    assert parse_nixl({"kv_transfer_params": None}) is None
    assert parse_nixl({"kv_transfer_params": {}}) is None
    nothing = {"do_remote_decode": False, "remote_engine_id": None, "remote_block_ids": None}
    assert parse_nixl({"kv_transfer_params": nothing}) is None


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"do_remote_prefill": False}, "do_remote_prefill"),
        ({"remote_engine_id": ""}, "remote_engine_id"),
        ({"remote_block_ids": None}, "remote_block_ids"),
        ({"remote_block_ids": [1, "2"]}, "remote_block_ids"),
        ({"remote_block_ids": [True]}, "remote_block_ids"),
        ({"remote_host": None}, "remote_host"),
        ({"remote_port": 0}, "remote_port"),
        ({"remote_port": 8000.0}, "remote_port"),
    ],
)
def test_unusable_decode_params_say_why(change: dict[str, Any], problem: str) -> None:
    leg = parse_nixl({"kv_transfer_params": {**SOURCE, **change}})
    assert leg is not None and leg.source is None and not leg.remote_decode
    assert leg.problem is not None and problem in leg.problem


@pytest.mark.parametrize("params", ["x", [1], 3, True])
def test_params_that_are_not_an_object_are_400(params: object) -> None:
    with pytest.raises(SimError) as info:
        parse_nixl({"kv_transfer_params": params})
    assert info.value.status == 400 and "kv_transfer_params" in info.value.message


def test_bootstrap_fields() -> None:
    body = {"bootstrap_host": "10.0.0.7", "bootstrap_port": 8998, "bootstrap_room": 2**63 - 1}
    assert parse_bootstrap(body) == Bootstrap("10.0.0.7", 8998, 2**63 - 1)
    assert parse_bootstrap({"prompt": "x"}) is None


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"bootstrap_room": 1}, "bootstrap_host"),
        ({"bootstrap_host": "h", "bootstrap_port": 1}, "bootstrap_room"),
        ({"bootstrap_host": "h", "bootstrap_port": 1, "bootstrap_room": 2**63}, "bootstrap_room"),
        ({"bootstrap_host": "h", "bootstrap_port": 1, "bootstrap_room": False}, "bootstrap_room"),
        ({"bootstrap_host": "h", "bootstrap_port": 70000, "bootstrap_room": 1}, "bootstrap_port"),
        ({"bootstrap_host": "", "bootstrap_port": 1, "bootstrap_room": 1}, "bootstrap_host"),
    ],
)
def test_bad_bootstrap_fields_are_400(body: dict[str, Any], field: str) -> None:
    with pytest.raises(SimError) as info:
        parse_bootstrap(body)
    assert info.value.status == 400 and field in info.value.message
