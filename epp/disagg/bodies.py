"""Request bodies of the P/D flows (pure: dict in, new dict out; docs/architecture.md,
P/D wire flows).

vLLM's NIXL pull flow: the prefill leg asks for one token and no stream, flagged
``do_remote_decode``; its response carries ``kv_transfer_params`` that the decode leg
(the client's own body, own stream and limits) passes on. SGLang's concurrent flow
sends one body, extended with the bootstrap rendezvous, to both servers.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

KV_TRANSFER_PARAMS = "kv_transfer_params"
# Body fields that steer KV transfers: only the EPP may set them (a client could
# otherwise make a decode server pull KV from any host).
PD_FIELDS = frozenset({KV_TRANSFER_PARAMS, "bootstrap_host", "bootstrap_port", "bootstrap_room"})


def without_pd_fields(doc: Mapping[str, Any]) -> dict[str, Any] | None:
    """The body without client-sent P/D fields, or None when it has none (the common
    case: nothing to rewrite)."""
    if not any(key in doc for key in PD_FIELDS):
        return None
    return {k: v for k, v in doc.items() if k not in PD_FIELDS}


def one_token(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The client's request cut to a non-streaming one-token prefill."""
    out = dict(doc)
    out["stream"] = False
    out.pop("stream_options", None)
    out["max_tokens"] = 1
    if "max_completion_tokens" in doc:
        out["max_completion_tokens"] = 1
    return out


def nixl_prefill(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The prefill leg of the NIXL flow: one token, and keep the KV for a remote decode."""
    out = one_token(doc)
    out[KV_TRANSFER_PARAMS] = {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "remote_engine_id": None,
        "remote_block_ids": None,
        "remote_host": None,
        "remote_port": None,
    }
    return out


def returned_kv_params(response: Any) -> dict[str, Any] | None:
    """The ``kv_transfer_params`` a prefill response handed back, if usable."""
    if not isinstance(response, Mapping):
        return None
    params = response.get(KV_TRANSFER_PARAMS)
    return dict(params) if isinstance(params, Mapping) and params else None


def nixl_decode(doc: Mapping[str, Any], kv_params: Mapping[str, Any]) -> dict[str, Any]:
    """The decode leg: the client's body as sent, plus where to pull the KV from."""
    out = dict(doc)
    out[KV_TRANSFER_PARAMS] = dict(kv_params)
    return out


def new_bootstrap_room(rng: random.Random) -> int:
    """SGLang's rendezvous id: a random 63-bit integer."""
    return rng.getrandbits(63)


def with_bootstrap(doc: Mapping[str, Any], host: str, port: int, room: int) -> dict[str, Any]:
    """SGLang's concurrent flow: the same body to both servers, naming the rendezvous."""
    out = dict(doc)
    out["bootstrap_host"] = host
    out["bootstrap_port"] = port
    out["bootstrap_room"] = room
    return out
