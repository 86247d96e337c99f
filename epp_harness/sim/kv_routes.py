"""The HTTP side of KV handoffs that prefill instances serve to decode instances.

``POST /sim/kv/pull`` ``{"engine_id": str, "block_ids": [int, ...]}``: a NIXL decode
takes the blocks a prefill leg held; 200 ``{"engine_id", "block_ids", "tokens"}``,
404 for another engine's id, 410 when the blocks are gone.

``POST /sim/bootstrap/join`` ``{"room": int, "timeout_seconds": number}``: an SGLang
decode joins a bootstrap room and waits for the prefill's KV; 200 ``{"room",
"tokens"}``, 504 when no prefill hands over in time, 409 when the room already has a
decode, 404 on an instance that is not a rendezvous prefill. It is served on the main
port and, given ``--bootstrap-port``, on that port too (``make_bootstrap_app``).
"""

from __future__ import annotations

import math
from typing import Any

import orjson
from aiohttp import web

from epp.types import Role
from epp_harness.sim.handoff import JOIN_PATH, PULL_PATH, SimHandoff
from epp_harness.sim.kv_params import is_room
from epp_harness.sim.protocol import SimError, bad_request, is_int
from epp_harness.sim.responses import error_response, json_response


async def _json_object(request: web.Request, shape: str) -> dict[str, Any]:
    try:
        doc = orjson.loads(await request.read())
    except orjson.JSONDecodeError:
        doc = None
    if not isinstance(doc, dict):
        raise bad_request(f"expected a JSON object {shape}")
    return doc


class KvRoutes:
    """Request handlers over one instance's SimHandoff."""

    def __init__(self, handoff: SimHandoff) -> None:
        self.handoff = handoff

    async def pull(self, request: web.Request) -> web.Response:
        try:
            doc = await _json_object(request, '{"engine_id": str, "block_ids": [int, ...]}')
            engine_id, block_ids = doc.get("engine_id"), doc.get("block_ids")
            if not isinstance(engine_id, str) or not engine_id:
                raise bad_request("`engine_id` must be a non-empty string")
            if not isinstance(block_ids, list) or not block_ids:
                raise bad_request("`block_ids` must be a non-empty list of integers")
            if not all(is_int(b) for b in block_ids):
                raise bad_request("`block_ids` must be a non-empty list of integers")
            tokens = self.handoff.hand_out(engine_id, block_ids)
        except SimError as exc:
            return error_response(exc)
        return json_response({"engine_id": engine_id, "block_ids": block_ids, "tokens": tokens})

    async def join(self, request: web.Request) -> web.Response:
        config = self.handoff.config
        try:
            if not (config.kv_connector.rendezvous and config.role is Role.PREFILL):
                raise SimError(
                    404,
                    "no bootstrap rendezvous here: this instance is role "
                    f"{config.role}, kv connector {config.kv_connector} "
                    "(rooms are served by prefill instances with sglang or mooncake)",
                )
            doc = await _json_object(request, '{"room": int, "timeout_seconds": number}')
            room = doc.get("room")
            if not is_room(room):
                raise bad_request("`room` must be an integer in [0, 2^63)")
            timeout = doc.get("timeout_seconds", config.bootstrap_timeout_seconds)
            if isinstance(timeout, bool) or not isinstance(timeout, int | float):
                raise bad_request("`timeout_seconds` must be a number")
            if not math.isfinite(timeout) or timeout < 0:
                raise bad_request("`timeout_seconds` must be a finite number >= 0")
            tokens = await self.handoff.rooms.join(room, float(timeout))
        except SimError as exc:
            return error_response(exc)
        return json_response({"room": room, "tokens": tokens})

    def add_to(self, app: web.Application, *, pull: bool = True) -> None:
        if pull:
            app.router.add_post(PULL_PATH, self.pull)
        app.router.add_post(JOIN_PATH, self.join)


def make_bootstrap_app(handoff: SimHandoff) -> web.Application:
    """The rendezvous alone, for a separate ``--bootstrap-port``."""
    app = web.Application()
    KvRoutes(handoff).add_to(app, pull=False)
    return app
