"""The EPP's HTTP surface on --http-port: /metrics and /health."""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from epp.admin.metrics import EppMetrics
from epp.datastore import Datastore


def make_admin_app(datastore: Datastore, metrics: EppMetrics) -> web.Application:
    async def metrics_handler(_: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(metrics.registry), headers={"content-type": CONTENT_TYPE_LATEST}
        )

    async def health_handler(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "endpoints": len(datastore)})

    app = web.Application()
    app.router.add_get("/metrics", metrics_handler)
    app.router.add_get("/health", health_handler)
    return app
