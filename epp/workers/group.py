"""The parent's side of ``--workers N``: starts the worker processes, restarts one that
dies, keeps every worker's datastore in step with its own, and passes back to its
ejector what the workers saw.

Workers are fresh interpreters (``python -m epp serve`` with the parent's own flags plus
the hidden ``--worker-link``/``--worker-index``), never forks: the parent may have
started gRPC or other threads. Each connects back over a unix socket in a private
directory and gets the whole membership and every member's newest load at once, then
every change as it happens; likewise the InferenceObjectives' priorities its discovery
watches. The workers share their in-flight counts among themselves
(:mod:`epp.datalayer.peers`, unix sockets in the same directory)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from aiohttp import web
from aiohttp.typedefs import Handler

from epp.common.restarts import Restarts
from epp.datastore import Datastore
from epp.flowcontrol.saturation import WatchedObjectives
from epp.lifecycle.observers import EndpointOutcomes
from epp.types import EndpointMetrics
from epp.workers import wire
from epp.workers.channel import Channel, StreamChannel
from epp.workers.merge import merge
from epp.workers.options import WorkerOptions

log = logging.getLogger(__name__)

START_TIMEOUT_S = 60.0  # a worker's first start, until it listens
RESTART_BACKOFF_S = (0.5, 10.0)  # first wait before a restart, longest
STEADY_S = 10.0  # a worker up this long restarts after the shortest wait again
FLUSH_TIMEOUT_S = 5.0
METRICS_TIMEOUT_S = 2.0  # a worker's /metrics, asked by the parent's
# load reports are gathered this long and sent together (one frame per worker): each
# frame wakes every worker, and each changes its scheduler's snapshot
LOADS_EVERY_S = 0.02


@dataclass
class Worker:
    index: int
    port: int  # 0 until it first listens on a free one
    pid: int | None = None
    http_port: int | None = None
    health_port: int | None = None
    acked: int = -1
    restarts: int = 0
    channel: Channel | None = None
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    exit_code: int | None = None


class WorkerGroup:
    def __init__(
        self,
        datastore: Datastore,
        outcomes: EndpointOutcomes,
        opts: WorkerOptions,
        grpc_port: int,
        argv: Sequence[str],
        grace_s: float = 10.0,
        *,
        objectives: WatchedObjectives | None = None,  # watched here, passed on
    ) -> None:
        self._datastore = datastore
        self._objectives = WatchedObjectives() if objectives is None else objectives
        self._outcomes = outcomes
        self._argv = list(argv)
        self._grace_s = grace_s
        self.workers = [Worker(i, port) for i, port in enumerate(opts.ports(grpc_port))]
        self._dir: Path | None = None
        self._server: asyncio.Server | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self._synced = False
        self._acks = asyncio.Condition()
        self._loads: dict[str, EndpointMetrics] = {}  # address -> newest, not yet sent
        self._loads_timer: asyncio.TimerHandle | None = None
        datastore.on_change(self._members_changed)
        datastore.on_metrics(self._metrics_changed)
        self._objectives.on_change(lambda: self._broadcast(self._objectives_message()))

    @property
    def grpc_ports(self) -> list[int]:
        return [w.port for w in self.workers]

    @property
    def health_port(self) -> int | None:
        return self.workers[0].health_port

    async def start(self) -> None:
        """Start every worker; return once all listen. OSError if one exits first."""
        self._dir = Path(tempfile.mkdtemp(prefix="epp-workers-"))
        path = self._dir / "link"
        self._server = await asyncio.start_unix_server(self._connected, str(path))
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._supervise(w, path), name=f"worker-{w.index}")
            for w in self.workers
        ]
        waits = [asyncio.ensure_future(w.ready.wait()) for w in self.workers]
        try:
            await asyncio.wait_for(asyncio.gather(*waits), START_TIMEOUT_S)
        except TimeoutError:
            await self.stop()
            raise OSError(f"the workers did not all listen within {START_TIMEOUT_S:g}s") from None
        failed = [w for w in self.workers if w.exit_code is not None]
        if failed:
            await self.stop()
            w = failed[0]
            raise OSError(f"worker {w.index} exited with code {w.exit_code} before it listened")

    async def stop(self) -> None:
        """SIGTERM every worker (each drains its open streams), then wait for them."""
        self._stopping = True
        if self._loads_timer is not None:
            self._loads_timer.cancel()
        for w in self.workers:
            self._signal(w, signal.SIGTERM)
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=self._grace_s + 5.0)
            for w in self.workers:
                self._signal(w, signal.SIGKILL)
            await asyncio.wait(self._tasks, timeout=5.0)
            for task in self._tasks:
                task.cancel()  # one waiting to restart a worker
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            self._server.close()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)

    def ready_info(self, http_port: int) -> dict[str, object]:
        """What the parent's ready file says: worker 0's ports as ``grpc_port`` and
        ``grpc_health_port``, every worker's in ``grpc_ports``."""
        return {
            "grpc_port": self.grpc_ports[0],
            "grpc_ports": self.grpc_ports,
            "http_port": http_port,
            "grpc_health_port": self.health_port,
            "worker_http_ports": [w.http_port for w in self.workers],
        }

    def add_routes(self, app: web.Application) -> None:
        """``GET /workers``: each worker's process, ports and restarts (JSON)."""

        async def workers(_: web.Request) -> web.Response:
            return web.json_response(
                {
                    "workers": [
                        {
                            "index": w.index,
                            "pid": w.pid,
                            "grpc_port": w.port,
                            "http_port": w.http_port,
                            "connected": w.channel is not None,
                            "restarts": w.restarts,
                        }
                        for w in self.workers
                    ]
                }
            )

        app.router.add_get("/workers", workers)

    async def exposition(self, own: bytes) -> bytes:
        """The parent's /metrics text with every answering worker's merged in (a worker
        that is restarting is left out of this page)."""

        async def fetch(session: aiohttp.ClientSession, w: Worker) -> tuple[int, str] | None:
            if w.http_port is None or w.channel is None:
                return None
            try:
                async with session.get(f"http://127.0.0.1:{w.http_port}/metrics") as reply:
                    return (w.index, await reply.text()) if reply.status == 200 else None
            except (aiohttp.ClientError, TimeoutError):
                return None

        timeout = aiohttp.ClientTimeout(total=METRICS_TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            answers = await asyncio.gather(*(fetch(session, w) for w in self.workers))
        texts = dict(a for a in answers if a is not None)
        return merge(own.decode(), texts).encode()

    @web.middleware
    async def flush_middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """An admin-API change (any POST) reaches every worker before its answer."""
        response = await handler(request)
        if request.method == "POST" and not await self.flushed():
            log.warning("%s: not every worker confirmed the change in time", request.path)
        return response

    def hang_up(self) -> None:
        """Pass SIGHUP on to every worker (each reloads its --config file)."""
        for w in self.workers:
            self._signal(w, signal.SIGHUP)

    async def flushed(self, timeout_s: float = FLUSH_TIMEOUT_S) -> bool:
        """Until every connected worker has applied the current membership (False if
        that took longer than ``timeout_s``)."""
        version = self._datastore.version

        def caught_up() -> bool:
            return all(w.acked >= version for w in self.workers if w.channel is not None)

        async with self._acks:
            try:
                await asyncio.wait_for(self._acks.wait_for(caught_up), timeout_s)
            except TimeoutError:
                return False
        return True

    # -- processes -----------------------------------------------------------------
    def peer_load_args(self, index: int) -> list[str]:
        """Worker ``index``'s peer-load flags: it publishes its in-flight counts on a
        unix socket in the parent's directory and follows every other worker's."""
        assert self._dir is not None

        def socket(i: int) -> str:
            return f"ipc://{self._dir}/load-{i}"

        others = [socket(w.index) for w in self.workers if w.index != index]
        return ["--peer-load-bind", socket(index), "--peer-load-peers", ",".join(others)]

    def _command(self, w: Worker, path: Path) -> list[str]:
        # the parent's own flags, then the ones that make it worker w (the last wins)
        return [
            sys.executable,
            "-m",
            "epp",
            *self._argv,
            "--worker-link",
            str(path),
            "--worker-index",
            str(w.index),
            "--grpc-port",
            str(w.port),
            "--http-port",
            "0",
            *self.peer_load_args(w.index),
        ]

    async def _supervise(self, w: Worker, path: Path) -> None:
        restarts = Restarts(*RESTART_BACKOFF_S, steady_s=STEADY_S)
        while not self._stopping:
            proc = await asyncio.create_subprocess_exec(
                *self._command(w, path), stdin=asyncio.subprocess.DEVNULL
            )
            w.pid = proc.pid
            began = time.monotonic()
            code = await proc.wait()
            w.pid = None
            if self._stopping:
                return
            if not w.ready.is_set():  # never listened: a flag or port problem
                w.exit_code = code
                w.ready.set()
                return
            wait_s = restarts.exited(time.monotonic() - began)
            w.restarts = restarts.count
            log.warning("%s", restarts.describe(f"worker {w.index} (port {w.port})", code, wait_s))
            await asyncio.sleep(wait_s)

    def _signal(self, w: Worker, sig: signal.Signals) -> None:
        if w.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(w.pid, sig)

    # -- the link ------------------------------------------------------------------
    async def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        channel = StreamChannel(reader, writer)
        hello = await channel.receive()
        if not isinstance(hello, wire.Hello) or not 0 <= hello.index < len(self.workers):
            channel.close()
            return
        w = self.workers[hello.index]
        w.channel = channel
        channel.send(wire.members(self._datastore.version, self._datastore.members()))
        loads = {m.address: m.state.metrics for m in self._datastore.members()}
        channel.send(_loads({a: m for a, m in loads.items() if m is not None}))
        channel.send(self._objectives_message())
        if self._synced:
            channel.send(wire.Synced())
        try:
            while (message := await channel.receive()) is not None:
                await self._handle(w, message)
        finally:
            if w.channel is channel:
                w.channel = None
            channel.close()
            async with self._acks:
                self._acks.notify_all()  # a gone worker holds no flush back

    async def _handle(self, w: Worker, message: wire.Message) -> None:
        if isinstance(message, wire.Ack):
            async with self._acks:
                w.acked = message.version
                self._acks.notify_all()
        elif isinstance(message, wire.Outcome):
            if message.ok:
                self._outcomes.success(message.address)
            else:
                self._outcomes.failure(
                    message.address, message.reason, message.slow, message.serving
                )
        elif isinstance(message, wire.Synced):
            if not self._synced:
                self._synced = True
                self._broadcast(wire.Synced())
        elif isinstance(message, wire.Ready):
            first = not w.ready.is_set()
            w.port, w.http_port, w.health_port = (
                message.grpc_port,
                message.http_port,
                message.health_port,
            )
            w.ready.set()
            log.info(
                "worker %d %s ext_proc port %d",
                w.index,
                "listening on" if first else f"is back (restart {w.restarts}) on",
                w.port,
            )

    def _broadcast(self, message: wire.Message) -> None:
        frame = wire.encode(message)
        for w in self.workers:
            if w.channel is not None:
                w.channel.send_frame(frame)

    def _objectives_message(self) -> wire.Objectives:
        return wire.Objectives(dict(self._objectives))

    def _members_changed(self) -> None:
        self._broadcast(wire.members(self._datastore.version, self._datastore.members()))

    def _metrics_changed(self, address: str, metrics: EndpointMetrics) -> None:
        self._loads[address] = metrics
        if self._loads_timer is None:
            loop = asyncio.get_running_loop()
            self._loads_timer = loop.call_later(LOADS_EVERY_S, self._send_loads)

    def _send_loads(self) -> None:
        self._loads_timer = None
        loads, self._loads = self._loads, {}
        self._broadcast(_loads(loads))


def _loads(reports: dict[str, EndpointMetrics]) -> wire.Loads:
    return wire.Loads([wire.EndpointData(a, wire.wire_metrics(m)) for a, m in reports.items()])
