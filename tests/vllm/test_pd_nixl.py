"""The `nixl` and `sidecar` coordinators with real engines: vLLM's NixlConnector on CPU
(the `nixl` package over UCX's TCP transport on loopback). The decode server pulls the
prompt's KV from the prefill server named in kv_transfer_params; with `sidecar` an
`epp sidecar` in front of the decode server runs the prefill leg."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.vllm.conftest import epp_stack, sidecar
from tests.vllm.pd import check_disaggregated, connector_args, epp_counter
from tests.vllm.servers import VllmServer, free_port, vllm_servers

pytestmark = pytest.mark.e2e
NIXL = connector_args({"kv_connector": "NixlConnector", "kv_buffer_device": "cpu"})


def nixl_env() -> dict[str, str]:
    # UCX's defaults hung the decode leg on this machine: TCP on loopback only; and each
    # server its own side channel (handshake) port
    return {
        "UCX_TLS": "tcp,self",
        "UCX_NET_DEVICES": "lo",
        "VLLM_NIXL_SIDE_CHANNEL_PORT": str(free_port()),
    }


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[VllmServer, VllmServer]]:
    workdir = tmp_path_factory.mktemp("vllm-nixl")
    specs = [("vllm-prefill", NIXL, nixl_env()), ("vllm-decode", NIXL, nixl_env())]
    with vllm_servers(workdir, specs) as (prefill, decode):
        yield prefill, decode


@pytest.mark.parametrize("chat", [False, True], ids=["completion", "chat-stream"])
def test_nixl_decode_server_pulls_the_prompt(
    servers: tuple[VllmServer, VllmServer], chat: bool, tmp_path_factory: pytest.TempPathFactory
) -> None:
    prefill, decode = servers
    flags = ["--prefill", prefill.address, "--decode", decode.address]
    with epp_stack(tmp_path_factory.mktemp("epp-nixl"), flags, coordinator="nixl") as stack:
        check_disaggregated(stack, prefill, decode, f"nixl-{chat}", chat)
        assert epp_counter(stack, "epp_prefill_legs_total", 'outcome="ok"') == 1


@pytest.mark.parametrize("chat", [False, True], ids=["completion", "chat-stream"])
def test_sidecar_runs_the_prefill_leg_and_the_decode_server_pulls(
    servers: tuple[VllmServer, VllmServer], chat: bool, tmp_path_factory: pytest.TempPathFactory
) -> None:
    prefill, decode = servers
    workdir = tmp_path_factory.mktemp("epp-sidecar")
    with sidecar(workdir, decode) as address:
        flags = ["--prefill", prefill.address, "--decode", address]
        with epp_stack(workdir / "epp", flags, coordinator="sidecar") as stack:
            check_disaggregated(stack, prefill, decode, f"sidecar-{chat}", chat)
