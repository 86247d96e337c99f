"""HealthBoard: the gRPC health statuses and HTTP /ready tell the same story."""

from __future__ import annotations

from collections.abc import Iterable

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from epp.admin.http import make_admin_app
from epp.common.health import HEALTH_SERVICES, READINESS, HealthBoard
from epp.datastore import Datastore
from epp.observability.metrics import EppMetrics


class Transport:
    """Records what the gRPC side was told; can be made to fail."""

    def __init__(self) -> None:
        self.told: list[tuple[bool, tuple[str, ...]]] = []
        self.fail = False

    async def set_serving(self, serving: bool, names: Iterable[str] = HEALTH_SERVICES) -> None:
        if self.fail:
            raise RuntimeError("gRPC health update failed")
        self.told.append((serving, tuple(names)))


async def ready_status(board: HealthBoard) -> tuple[int, dict[str, str]]:
    ds = Datastore()
    app = make_admin_app(ds, EppMetrics(ds), ready=board.serving)
    async with (
        TestServer(app) as server,
        aiohttp.ClientSession() as session,
        session.get(server.make_url("/ready")) as resp,
    ):
        return resp.status, await resp.json()


async def test_ready_follows_readiness_both_ways() -> None:
    transport = Transport()
    board = HealthBoard(transport)
    assert await ready_status(board) == (503, {"status": "NOT_SERVING"})  # nothing said yet
    await board.set_serving(True, ["liveness"])
    assert await ready_status(board) == (503, {"status": "NOT_SERVING"})  # alive, not ready
    await board.set_serving(True)
    assert await ready_status(board) == (200, {"status": "SERVING"})
    await board.set_serving(False)  # e.g. the pool deleted, or SIGTERM
    assert await ready_status(board) == (503, {"status": "NOT_SERVING"})
    assert transport.told == [
        (True, ("liveness",)),
        (True, HEALTH_SERVICES),
        (False, HEALTH_SERVICES),
    ]
    assert READINESS in HEALTH_SERVICES


async def test_a_failed_grpc_update_leaves_http_where_grpc_is() -> None:
    transport = Transport()
    board = HealthBoard(transport)
    await board.set_serving(True)
    transport.fail = True
    with pytest.raises(RuntimeError):
        await board.set_serving(False)
    assert board.serving()  # gRPC still says SERVING, so does /ready
    assert await ready_status(board) == (200, {"status": "SERVING"})
