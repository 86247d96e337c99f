"""Admin API for LoRA adapters: ``GET /lora/adapters`` (open) lists the catalogue and
what each server holds as far as the EPP knows; ``POST /lora/load`` and ``POST
/lora/unload`` (API key required, as ``/instances/*``) with ``{"adapter": name,
"instance": "ip:port"}`` load or unload one by hand through the server's own API. The
catalogue (``models.adapters``) gives the path a load sends."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol

import orjson
from aiohttp import web

from epp.common.replies import error, ok
from epp.datastore import Datastore
from epp.lora.placement import AdapterPlacement, PlacementError


class Auth(Protocol):
    """The admin API's key check (epp.admin.auth.ApiKeyAuth): None lets the request in,
    else the refusal to answer."""

    def refusal(self, request: web.Request) -> web.Response | None: ...


def _body(raw: bytes) -> tuple[str, str]:
    """(adapter, instance) of a load/unload body; ValueError saying what is wrong."""
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"body is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ValueError("body must be a JSON object")
    adapter, instance = doc.get("adapter"), doc.get("instance")
    if not isinstance(adapter, str) or not adapter:
        raise ValueError("'adapter' is required: the adapter's name in models.adapters")
    if not isinstance(instance, str) or not instance:
        raise ValueError("'instance' is required: the server's ip:port, as /status lists it")
    return adapter, instance


def add_lora_routes(
    app: web.Application,
    placement: AdapterPlacement,
    datastore: Datastore,
    catalogue: Callable[[], Mapping[str, str]],
    auth: Auth,
) -> None:
    async def adapters(_: web.Request) -> web.Response:
        return ok(
            {
                "catalogue": dict(catalogue()),
                "placement": placement.cfg.enabled,
                "servers": placement.listing(),
            }
        )

    def handler(verb: str) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def run(request: web.Request) -> web.Response:
            refusal = auth.refusal(request)
            if refusal is not None:
                return refusal
            try:
                adapter, instance = _body(await request.read())
            except ValueError as exc:
                return error(400, "invalid_body", str(exc))
            if datastore.member(instance) is None:
                return error(404, "unknown_instance", f"{instance} is not in the pool")
            try:
                if verb == "load":
                    await placement.load(adapter, instance)
                else:
                    await placement.unload(adapter, instance)
            except PlacementError as exc:
                return error(exc.status, exc.code or "lora_placement_failed", exc.message)
            return ok({"adapter": adapter, "instance": instance, "result": f"{verb}ed"})

        return run

    app.router.add_get("/lora/adapters", adapters)
    app.router.add_post("/lora/load", handler("load"))
    app.router.add_post("/lora/unload", handler("unload"))
