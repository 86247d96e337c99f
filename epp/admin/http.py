"""The EPP's HTTP surface on --http-port: /metrics, /health and /ready."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Handler
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from epp.admin.metricsauth import MetricsAuth
from epp.common.replies import error
from epp.datastore import Datastore
from epp.observability.metrics import EppMetrics

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


def make_admin_app(
    datastore: Datastore,
    metrics: EppMetrics,
    *,
    ready: Callable[[], bool],
    metrics_auth: MetricsAuth | None = None,
    exposition: Callable[[bytes], Awaitable[bytes]] | None = None,
) -> web.Application:
    """``ready``: the gRPC ``readiness`` status, which ``/ready`` answers with;
    ``metrics_auth``: who may read /metrics (None: anyone); ``exposition``: turns this
    process's /metrics text into the page served (the parent of ``--workers`` merges its
    workers' in)."""

    async def metrics_handler(request: web.Request) -> web.Response:
        if metrics_auth is not None:
            refused = await metrics_auth.refusal(request)
            if refused is not None:
                return refused
        metrics.expire_series()
        body = generate_latest(metrics.registry)
        if exposition is not None:
            body = await exposition(body)
        return web.Response(body=body, headers={"content-type": CONTENT_TYPE_LATEST})

    async def health_handler(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "endpoints": len(datastore)})

    async def ready_handler(_: web.Request) -> web.Response:
        if ready():
            return web.json_response({"status": "SERVING"})
        return web.json_response({"status": "NOT_SERVING"}, status=503)

    app = web.Application(middlewares=[json_errors])
    app.router.add_get("/metrics", metrics_handler)
    app.router.add_get("/health", health_handler)
    app.router.add_get("/ready", ready_handler)
    return app
