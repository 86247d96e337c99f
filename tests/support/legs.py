"""An in-memory :class:`epp.disagg.legs.LegTransport`: prefill servers are async
functions keyed by ``host:port``, every leg sent is recorded, nothing touches a socket.

A server named by no handler is unreachable (LegFailed before ``connected``); a handler
is called once the leg is "on the wire" (``connected`` set) and may answer, wait on an
event the test controls, or raise LegFailed (a timeout after connecting)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import orjson

from epp.disagg.legs import LegFailed


@dataclass(frozen=True, slots=True)
class SentLeg:
    url: str
    headers: Mapping[str, str]
    body: bytes

    @property
    def address(self) -> str:
        return urlsplit(self.url).netloc

    @property
    def path(self) -> str:
        return urlsplit(self.url).path

    def json(self) -> Any:
        return orjson.loads(self.body)


Handler = Callable[[SentLeg], Awaitable[tuple[int, bytes]]]


def answer(status: int, doc: Any = None, *, raw: bytes | None = None) -> Handler:
    """A server that answers every leg with ``status`` and ``doc`` as JSON (or ``raw``)."""
    body = raw if raw is not None else orjson.dumps(doc if doc is not None else {})

    async def handle(_leg: SentLeg) -> tuple[int, bytes]:
        return status, body

    return handle


def held(release: asyncio.Event, then: Handler) -> Handler:
    """A server that holds each leg until ``release`` is set, then answers as ``then``."""

    async def handle(leg: SentLeg) -> tuple[int, bytes]:
        await release.wait()
        return await then(leg)

    return handle


def times_out(after: asyncio.Event | None = None) -> Handler:
    """A server that takes the leg and never answers in time (optionally once ``after``
    is set): the transport's timeout, as LegFailed."""

    async def handle(leg: SentLeg) -> tuple[int, bytes]:
        if after is not None:
            await after.wait()
        raise LegFailed(f"{leg.address}: TimeoutError: ")

    return handle


class MemoryLegTransport:
    """Serves legs from ``servers``; ``sent`` lists every leg in order, ``open`` counts
    legs still connecting or waiting for their answer, ``closed`` says whether close()
    ran. With ``connect_gate``, a leg is on the wire (``connected``) only once the gate
    is set: a slow connect."""

    def __init__(
        self,
        servers: Mapping[str, Handler] | None = None,
        connect_gate: asyncio.Event | None = None,
    ) -> None:
        self.servers: dict[str, Handler] = dict(servers or {})
        self.connect_gate = connect_gate
        self.sent: list[SentLeg] = []
        self.open = 0
        self.closed = False

    async def post(
        self,
        url: str,
        body: bytes,
        headers: Mapping[str, str],
        connected: asyncio.Event | None,
    ) -> tuple[int, bytes]:
        leg = SentLeg(url, dict(headers), body)
        self.sent.append(leg)
        handler = self.servers.get(leg.address)
        if handler is None:
            raise LegFailed(f"{leg.address}: ClientConnectorError: connection refused")
        self.open += 1
        try:
            if self.connect_gate is not None:
                await self.connect_gate.wait()
            if connected is not None:
                connected.set()
            return await handler(leg)
        finally:
            self.open -= 1

    async def close(self) -> None:
        self.closed = True
