"""What the native transport's tests share: a small pool behind a router, a request
body, and the transport serving it on a free loopback port."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import orjson

from epp.config import build_scheduler
from epp.datastore import Datastore
from epp.extproc.native.server import NativeTransport
from epp.observability.metrics import EppMetrics
from epp.router import Router
from epp.types import Endpoint
from tests.support.routers import make_router as make_lifecycle

LEAST_REQUEST = (Path(__file__).parents[2] / "configs" / "least-request.yaml").read_text()
BODY = orjson.dumps({"model": "m", "prompt": "hello " * 50, "max_tokens": 4})


def make_router() -> Router:
    """Two endpoints, least-request picking, a seeded rng."""
    ds = Datastore()
    for i in range(2):
        ds.add(Endpoint("127.0.0.1", 8000 + i))
    return make_lifecycle(ds, build_scheduler(LEAST_REQUEST), EppMetrics(ds), rng=random.Random(0))


@asynccontextmanager
async def serving() -> AsyncIterator[tuple[NativeTransport, Router, int]]:
    """The native transport over :func:`make_router`'s router, serving: (it, the
    router, its port); stopped at the end."""
    router = make_router()
    transport = NativeTransport(router)
    port = await transport.start("127.0.0.1", 0)
    await transport.set_serving(True)
    try:
        yield transport, router, port
    finally:
        await transport.stop(0)
