"""The EPP's HTTP surface on --http-port: /metrics and /health."""

from __future__ import annotations

from aiohttp import web
from aiohttp.typedefs import Handler
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from epp.admin.metrics import EppMetrics
from epp.admin.replies import error
from epp.datastore import Datastore

_CODES = {404: "not_found", 405: "method_not_allowed", 413: "body_too_large"}


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """aiohttp's own errors (unknown path, wrong method, body over the limit) in the
    same JSON shape as every other answer of this port."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = _CODES.get(exc.status, "http_error")
        return error(exc.status, code, f"{request.method} {request.path}: {exc.reason}")


def make_admin_app(datastore: Datastore, metrics: EppMetrics) -> web.Application:
    async def metrics_handler(_: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(metrics.registry), headers={"content-type": CONTENT_TYPE_LATEST}
        )

    async def health_handler(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "endpoints": len(datastore)})

    app = web.Application(middlewares=[json_errors])
    app.router.add_get("/metrics", metrics_handler)
    app.router.add_get("/health", health_handler)
    return app
