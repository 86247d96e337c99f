"""The `kv-pool` coordinator with real engines: vLLM's ExampleConnector on both servers,
sharing one storage directory (the KV pool): the EPP prefills on the prefill server
(max_tokens 1), the decode server loads the prompt's KV from the pool."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from epp_harness.stack import LocalStack
from tests.vllm.conftest import epp_stack
from tests.vllm.pd import check_disaggregated, connector_args, epp_counter
from tests.vllm.servers import VllmServer, vllm_servers

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def pd(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[LocalStack, VllmServer, VllmServer]]:
    workdir = tmp_path_factory.mktemp("vllm-kv-pool")
    pool = connector_args(
        {"kv_connector": "ExampleConnector",
         "kv_connector_extra_config": {"shared_storage_path": str(workdir / "kv-pool")}}
    )  # fmt: skip
    specs = [("vllm-prefill", pool, {}), ("vllm-decode", pool, {})]
    with vllm_servers(workdir, specs) as (prefill, decode):
        flags = ["--prefill", prefill.address, "--decode", decode.address]
        with epp_stack(workdir / "epp", flags, coordinator="kv-pool") as stack:
            yield stack, prefill, decode


@pytest.mark.parametrize("chat", [False, True], ids=["completion", "chat-stream"])
def test_decode_server_loads_the_prompt_from_the_pool(
    pd: tuple[LocalStack, VllmServer, VllmServer], chat: bool
) -> None:
    stack, prefill, decode = pd
    legs = epp_counter(stack, "epp_prefill_legs_total", 'outcome="ok"')
    check_disaggregated(stack, prefill, decode, f"kv-pool-{chat}", chat)
    assert epp_counter(stack, "epp_prefill_legs_total", 'outcome="ok"') == legs + 1
