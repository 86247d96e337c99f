"""A worker's end of the link: its datastore follows the parent's membership and
endpoint data, its scheduler the parent's watched InferenceObjectives; what only it
sees (request outcomes, Envoy's EDS acknowledgement) goes back to the parent."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

from epp.common.looptask import LoopTask
from epp.datastore import Datastore, Status
from epp.flowcontrol.saturation import WatchedObjectives
from epp.workers import wire
from epp.workers.channel import Channel, StreamChannel
from epp.xds.eds import EnvoySync

log = logging.getLogger(__name__)

# how long a starting worker waits for the parent's first membership
FIRST_MEMBERS_TIMEOUT_S = 30.0
# successes on one endpoint passed on at most this often, unless a failure came between
# (the ejector needs the first success after failures, and one within its slow grace,
# 30 s by default); each message wakes the parent, so not per request
SUCCESS_EVERY_S = 1.0


def apply_members(datastore: Datastore, message: wire.Members) -> None:
    """Make ``datastore`` hold what the parent listed: new members added, statuses
    followed, the unlisted ones removed (they drain here while this worker's own
    requests to them are open)."""
    listed: set[str] = set()
    for listed_member in message.members:
        endpoint = wire.endpoint(listed_member.endpoint)
        status = wire.status(listed_member)
        listed.add(endpoint.address)
        if status is Status.DRAINING:
            datastore.remove(endpoint.address)
            continue
        datastore.add(endpoint, waiting=status is Status.WAITING)
        if status is Status.EJECTED:
            datastore.eject(endpoint.address)
        elif status is Status.ACTIVE:
            datastore.reinstate(endpoint.address)
    for member in datastore.members():
        if member.address not in listed:
            datastore.remove(member.address)


class _WorkerTag(logging.Filter):
    def __init__(self, index: int) -> None:
        super().__init__()
        self._tag = f"[worker {index}]"

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.endswith(self._tag):
            record.name = f"{record.name}{self._tag}"
        return True


def tag_logs(index: int) -> None:
    """Name the worker in every log line it writes (``epp.extproc.stream[worker 1]: ...``); its
    membership lines are left to the parent, which logs them once."""
    for handler in logging.getLogger().handlers:
        handler.addFilter(_WorkerTag(index))
    logging.getLogger("epp.datastore").setLevel(logging.WARNING)


class SharedSync(EnvoySync):
    """EnvoySync told by every worker: Envoy's EDS stream reaches one worker, whose
    acknowledgement the parent passes on to the others."""

    def __init__(self) -> None:
        super().__init__()
        self.link: WorkerLink | None = None

    def acknowledged(self) -> None:
        if not self.synced and self.link is not None:
            self.link.send(wire.Synced())
        super().acknowledged()


class WorkerLink:
    """The connection to the parent (a component: started before the ports open, so
    the first pick already knows the pool); also the router's EndpointOutcomes."""

    def __init__(
        self,
        datastore: Datastore,
        path: Path,
        index: int,
        sync: SharedSync,
        objectives: WatchedObjectives | None = None,  # the parent's, followed here
        *,
        channel: Channel | None = None,  # already connected (tests); None: open ``path``
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._datastore = datastore
        self._path = path
        self.index = index
        self._sync = sync
        sync.link = self
        self._objectives = WatchedObjectives() if objectives is None else objectives
        self._channel = channel
        self._reader = LoopTask("worker-link", self._read)
        self._clock = clock
        self._told_success: dict[str, float] = {}  # address -> when; gone after a failure

    async def start(self) -> None:
        if self._channel is None:
            reader, writer = await asyncio.open_unix_connection(str(self._path))
            self._channel = StreamChannel(reader, writer)
        self._channel.send(wire.Hello(self.index, os.getpid()))
        try:
            await asyncio.wait_for(self._until_members(), FIRST_MEMBERS_TIMEOUT_S)
        except TimeoutError:
            raise OSError(f"worker {self.index}: no membership from the parent") from None
        self._reader.start()

    async def stop(self) -> None:
        await self._reader.stop()
        if self._channel is not None:
            self._channel.close()

    def send(self, message: wire.Message) -> None:
        if self._channel is not None:
            self._channel.send(message)

    def ready(self, grpc_port: int, http_port: int, health_port: int | None) -> None:
        self.send(wire.Ready(grpc_port, http_port, health_port))

    # EndpointOutcomes
    def failure(self, address: str, reason: str, slow: bool = False, serving: bool = False) -> None:
        self._told_success.pop(address, None)
        self.send(wire.Outcome(address, False, reason, slow, serving))

    def success(self, address: str) -> None:
        now = self._clock()
        if now - self._told_success.get(address, -SUCCESS_EVERY_S) >= SUCCESS_EVERY_S:
            self._told_success[address] = now
            self.send(wire.Outcome(address, True))

    async def _until_members(self) -> None:
        while True:
            message = await self._receive()
            if message is None:
                raise OSError(f"worker {self.index}: the parent closed the link")
            self._apply(message)
            if isinstance(message, wire.Members):
                return

    async def _receive(self) -> wire.Message | None:
        assert self._channel is not None
        return await self._channel.receive()

    async def _read(self) -> None:
        while (message := await self._receive()) is not None:
            self._apply(message)
        log.warning("worker %d: the parent is gone; stopping", self.index)
        os.kill(os.getpid(), signal.SIGTERM)  # the usual graceful stop

    def _apply(self, message: wire.Message) -> None:
        if isinstance(message, wire.Members):
            apply_members(self._datastore, message)
            self.send(wire.Ack(message.version))
        elif isinstance(message, wire.Loads):
            for report in message.reports:
                self._datastore.update_metrics(report.address, wire.metrics(report.metrics))
        elif isinstance(message, wire.Objectives):
            self._objectives.replace(message.priorities)
        elif isinstance(message, wire.Synced):
            EnvoySync.acknowledged(self._sync)
