"""``epp serve`` in two steps: :func:`epp.serving.wiring.build` wires an App and starts nothing;
:func:`epp.serving.lifecycle.run` starts it. A discovery source kind handed to ``build`` is
asked, started and stopped with no change to serve."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest

from epp import config
from epp.common.params import ConfigError
from epp.common.readyfile import read_ready
from epp.serving import lifecycle
from epp.serving.lifecycle import App
from epp.serving.sources import DISCOVERY_SOURCES, DiscoveryContext, DiscoveryKind
from epp.serving.wiring import ServeOptions, build
from epp.types import Endpoint, Role

# this process imports grpcio's health module elsewhere (tests/unit/test_errors.py);
# grpclib's cannot share it
TRANSPORT = "grpcio"


def _listening() -> int:
    """How many TCP ports this process listens on."""
    mine = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except FileNotFoundError:  # the directory's own descriptor, closed by now
            continue
        if link.startswith("socket:["):
            mine.add(link[len("socket:[") : -1])
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            count += fields[3] == "0A" and fields[9] in mine  # 0A: LISTEN
    return count


def _build(tmp_path: Path, text: str = "", **kinds: DiscoveryKind) -> App:
    cfg = config.load_text(f"dataLayer: {{scrapeMetrics: false}}\n{text}", "<test>")
    opts = ServeOptions(
        grpc_port=0,
        http_port=0,
        transport=TRANSPORT,
        ready_file=tmp_path / "ready",
        shutdown_grace_s=0.0,
    )
    scheduler = config.instantiate(cfg, config.builtin_registry())
    return build(opts, cfg, scheduler, discovery={**DISCOVERY_SOURCES, **kinds})


async def _ready(path: Path) -> dict[str, int]:
    for _ in range(500):
        info = read_ready(path)
        if info is not None:
            return info
        await asyncio.sleep(0.01)
    raise AssertionError("never ready")


async def _get(port: int, path: str) -> tuple[int, str]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}{path}") as response,
    ):
        return response.status, await response.text()


class _Recorded:
    """A source that adds one endpoint on start and holds readiness until released."""

    def __init__(self, ctx: DiscoveryContext, log: list[str]) -> None:
        self.ctx = ctx
        self.log = log
        self.report: Callable[[bool], Awaitable[None]] = ctx.readiness.hold("test")

    async def start(self) -> None:
        self.log.append("start")
        self.ctx.datastore.add(Endpoint("127.0.0.1", 1, Role.DECODE, engine=self.ctx.engine))

    async def stop(self) -> None:
        self.log.append("stop")


@pytest.mark.parametrize("coordinator", ["nixl", "kv-pool", "sidecar", "concurrent"])
async def test_defer_decode_needs_a_coordinator_that_can(tmp_path: Path, coordinator: str) -> None:
    text = f"disaggregation: {{coordinator: {coordinator}, deferDecode: true}}\n"
    if coordinator in ("nixl", "kv-pool"):
        _build(tmp_path, text)
        return
    with pytest.raises(ConfigError, match=f"deferDecode: the {coordinator} coordinator"):
        _build(tmp_path, text)


async def test_build_opens_nothing_and_a_registered_source_is_used(tmp_path: Path) -> None:
    events: list[str] = []
    made: list[_Recorded] = []

    def create(ctx: DiscoveryContext) -> _Recorded:
        made.append(_Recorded(ctx, events))
        return made[-1]

    tasks, listening = len(asyncio.all_tasks()), _listening()
    app = _build(tmp_path, recorded=DiscoveryKind("test endpoints", create))
    assert (len(asyncio.all_tasks()), _listening()) == (tasks, listening)  # nothing started
    assert len(made) == 1 and events == []  # asked at build, not started

    running = asyncio.create_task(lifecycle.run(app))
    info = await _ready(tmp_path / "ready")
    assert events == ["start"]
    assert _listening() == listening + 2  # the gRPC and HTTP ports
    source = made[0]
    assert source.ctx.datastore.member("127.0.0.1:1") is not None
    assert await _get(info["http_port"], "/ready") == (503, '{"status": "NOT_SERVING"}')
    await source.report(True)
    assert await _get(info["http_port"], "/ready") == (200, '{"status": "SERVING"}')
    status, body = await _get(info["http_port"], "/status")
    assert status == 200 and '"instance": "127.0.0.1:1"' in body

    os.kill(os.getpid(), signal.SIGTERM)  # run() handles it (installed before it waits)
    await asyncio.wait_for(running, 10)
    assert events == ["start", "stop"]
    with pytest.raises(aiohttp.ClientConnectionError):
        await _get(info["http_port"], "/ready")


async def test_a_kind_that_is_not_asked_for_builds_nothing(tmp_path: Path) -> None:
    app = _build(tmp_path, absent=DiscoveryKind("never", lambda ctx: None))
    assert not any(isinstance(c, _Recorded) for c in app.components)
