"""Read the P/D handoff fields of a request body, and build the ones a prefill returns
(pure, no I/O).

vLLM's NIXL connector uses ``kv_transfer_params``: a prefill leg carries
``do_remote_decode: true``; a decode leg carries what the prefill returned
(``do_remote_prefill: true``, ``remote_engine_id``, ``remote_block_ids``,
``remote_host``, ``remote_port``). SGLang (and its Mooncake backend) puts
``bootstrap_host``, ``bootstrap_port`` and ``bootstrap_room`` at the top level.

A body that is malformed (a field of the wrong JSON type) is a 400; a decode leg whose
params cannot name a source is not an error: the decode instance prefills itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard

from epp_harness.sim.config import address
from epp_harness.sim.protocol import bad_request, is_int

KV_TRANSFER_PARAMS = "kv_transfer_params"
ROOM_LIMIT = 2**63  # SGLang's bootstrap_room is a random 63-bit integer


@dataclass(frozen=True, slots=True)
class RemotePrefill:
    """Where a NIXL decode leg pulls its prompt's KV from."""

    engine_id: str
    block_ids: tuple[int, ...]
    host: str
    port: int

    @property
    def address(self) -> str:
        return address(self.host, self.port)


@dataclass(frozen=True, slots=True)
class NixlLeg:
    """A request that carries ``kv_transfer_params``.

    Exactly one holds: ``remote_decode`` (a prefill leg: keep the KV for a remote
    decode), ``source`` (a decode leg that can pull), ``problem`` (a decode leg whose
    params cannot be used, and why).
    """

    remote_decode: bool = False
    source: RemotePrefill | None = None
    problem: str | None = None


@dataclass(frozen=True, slots=True)
class Bootstrap:
    """An SGLang rendezvous: the room, served by the prefill instance at host:port."""

    host: str
    port: int
    room: int

    @property
    def address(self) -> str:
        return address(self.host, self.port)


def _remote_prefill(params: Mapping[str, Any]) -> RemotePrefill | str:
    """The pull source named by decode-leg params, or what is wrong with them."""
    if params.get("do_remote_prefill") is not True:
        return "do_remote_prefill is not true"
    engine_id = params.get("remote_engine_id")
    if not isinstance(engine_id, str) or not engine_id:
        return "remote_engine_id is missing"
    blocks = params.get("remote_block_ids")
    if not isinstance(blocks, list) or not blocks or not all(is_int(b) for b in blocks):
        return "remote_block_ids is not a non-empty list of block ids"
    host = params.get("remote_host")
    if not isinstance(host, str) or not host:
        return "remote_host is missing"
    port = params.get("remote_port")
    if not is_int(port) or not 1 <= port <= 65535:
        return "remote_port is not a port number"
    return RemotePrefill(engine_id, tuple(blocks), host, port)


def parse_nixl(body: Mapping[str, Any]) -> NixlLeg | None:
    """The NIXL leg a body asks for; None when it asks for no handoff at all.

    Params whose values are all null or false ask for nothing (a plain request).
    """
    params = body.get(KV_TRANSFER_PARAMS)
    if params is None:
        return None
    if not isinstance(params, dict):
        raise bad_request(f"`{KV_TRANSFER_PARAMS}` must be an object")
    if params.get("do_remote_decode") is True:
        return NixlLeg(remote_decode=True)
    if not any(v not in (None, False) for v in params.values()):
        return None
    source = _remote_prefill(params)
    if isinstance(source, str):
        return NixlLeg(problem=source)
    return NixlLeg(source=source)


def nixl_source_params(
    engine_id: str, block_ids: list[int], host: str, port: int
) -> dict[str, Any]:
    """The ``kv_transfer_params`` a NIXL prefill answers with: where to pull its KV."""
    return {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_engine_id": engine_id,
        "remote_block_ids": block_ids,
        "remote_host": host,
        "remote_port": port,
        "tp_size": 1,
    }


def is_room(value: object) -> TypeGuard[int]:
    """A valid ``bootstrap_room``: SGLang draws a random 63-bit integer."""
    return is_int(value) and 0 <= value < ROOM_LIMIT


def parse_bootstrap(body: Mapping[str, Any]) -> Bootstrap | None:
    """The SGLang rendezvous a body names; None when it has no bootstrap fields."""
    host, port, room = (body.get(k) for k in ("bootstrap_host", "bootstrap_port", "bootstrap_room"))
    if host is None and port is None and room is None:
        return None
    if not is_room(room):
        raise bad_request("`bootstrap_room` must be an integer in [0, 2^63)")
    if not isinstance(host, str) or not host:
        raise bad_request("`bootstrap_host` must be a non-empty string")
    if not is_int(port) or not 1 <= port <= 65535:
        raise bad_request("`bootstrap_port` must be an integer in 1-65535")
    return Bootstrap(host, port, room)
