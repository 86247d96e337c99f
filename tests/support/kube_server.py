"""Serving a :class:`~tests.support.fake_kube.FakeKube`: on the running loop, or from a
thread for tests that drive other processes; and a kubeconfig pointing at it."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import TypeVar

import yaml
from aiohttp import web

from tests.support.fake_kube import FakeKube

T = TypeVar("T")


@asynccontextmanager
async def serving(fake: FakeKube) -> AsyncIterator[str]:
    """Serve ``fake`` on a loopback port of the running loop; yields its base URL."""
    runner = web.AppRunner(fake.app(), access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        fake.drop_watches()
        await runner.cleanup()


def write_kubeconfig(path: Path, server: str, namespace: str = "default") -> Path:
    """A kubeconfig whose current context points at ``server`` with a bearer token."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fake", "cluster": {"server": server}}],
        "users": [{"name": "epp", "user": {"token": "fake-token"}}],
        "contexts": [
            {"name": "fake", "context": {"cluster": "fake", "user": "epp", "namespace": namespace}}
        ],
        "current-context": "fake",
    }
    path.write_text(yaml.safe_dump(config))
    return path


class FakeKubeThread:
    """A :class:`FakeKube` served from its own event loop in a daemon thread."""

    def __init__(self) -> None:
        self.fake = FakeKube()
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="fake-kube", daemon=True)
        self._started = threading.Event()

    def _run(self) -> None:
        self._loop.run_until_complete(self._main())

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        async with serving(self.fake) as url:
            self.url = url
            self._started.set()
            await self._stop.wait()

    def call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the server's loop (state is only touched there) and return its value."""

        async def run() -> T:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout=10)

    @contextmanager
    def running(self) -> Iterator[FakeKubeThread]:
        self._thread.start()
        if not self._started.wait(10):
            raise RuntimeError("fake Kubernetes API server did not start")
        try:
            yield self
        finally:
            assert self._stop is not None
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(10)
            self._loop.close()
