"""The prefill leg as an HTTP call from the EPP (or the sidecar) to a prefill server,
through a :class:`LegTransport`: aiohttp in production, memory in tests."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

import aiohttp
import orjson

from epp.errors import InternalError
from epp.types import Endpoint

# Client headers a prefill leg carries over (the body is JSON we re-encode); with
# --tracing, traceparent names the EPP's prefill span (the tracing observer adds it,
# epp.lifecycle.observers.tracing), else the client's.
FORWARDED_HEADERS = (
    "authorization",
    "x-request-id",
    "x-gateway-inference-objective",
    "traceparent",
    "tracestate",
)


@dataclass(frozen=True, slots=True)
class LegResult:
    status: int
    body: bytes
    seconds: float

    def json(self) -> Any:
        """The decoded body, or None when it is not JSON."""
        try:
            return orjson.loads(self.body)
        except orjson.JSONDecodeError:
            return None


class LegFailed(InternalError):
    """The prefill server could not be reached or did not answer in time."""


class LegTransport(Protocol):
    """Sends one prefill leg over HTTP: the seam between the coordinators and the
    network (tests serve legs from memory through it)."""

    async def post(
        self,
        url: str,
        body: bytes,
        headers: Mapping[str, str],
        connected: asyncio.Event | None,
    ) -> tuple[int, bytes]:
        """POST ``body`` to ``url`` and return the answer's status and whole body,
        whatever the status. Sets ``connected`` (when given) once the request is on the
        wire, before the answer. Raises :class:`LegFailed` when the server cannot be
        reached or does not answer in time; nothing else escapes but cancellation."""
        ...

    async def close(self) -> None:
        """Close idle connections (shutdown)."""
        ...


class LegClient:
    """Posts prefill legs: the client's forwarded headers, its JSON re-encoded, timed.
    ``connected`` (when given) is set once the request is on the wire, so a concurrent
    coordinator knows the server is up before routing the decode leg."""

    def __init__(self, transport: LegTransport) -> None:
        self._transport = transport

    async def post(
        self,
        endpoint: Endpoint,
        path: str,
        doc: Mapping[str, Any],
        headers: Mapping[str, str],
        connected: asyncio.Event | None = None,
    ) -> LegResult:
        send = {k: v for k, v in headers.items() if k in FORWARDED_HEADERS}
        send["content-type"] = "application/json"
        start = time.perf_counter()
        status, body = await self._transport.post(
            f"http://{endpoint.address}{path}", orjson.dumps(doc), send, connected
        )
        return LegResult(status, body, time.perf_counter() - start)

    async def close(self) -> None:
        await self._transport.close()


class AiohttpLegTransport:
    """Legs over aiohttp keep-alive connections, with a connect and a total timeout."""

    def __init__(self, connect_timeout_s: float, total_timeout_s: float) -> None:
        self._timeout = aiohttp.ClientTimeout(total=total_timeout_s, sock_connect=connect_timeout_s)
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:  # created lazily: needs the running loop
            trace = aiohttp.TraceConfig()
            trace.on_request_headers_sent.append(_mark_connected)
            self._session = aiohttp.ClientSession(
                timeout=self._timeout,
                trace_configs=[trace],
                connector=aiohttp.TCPConnector(limit=0),
            )
        return self._session

    async def post(
        self,
        url: str,
        body: bytes,
        headers: Mapping[str, str],
        connected: asyncio.Event | None,
    ) -> tuple[int, bytes]:
        try:
            async with self._client().post(
                url, data=body, headers=headers, trace_request_ctx={"connected": connected}
            ) as resp:
                return resp.status, await resp.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            where = urlsplit(url).netloc
            raise LegFailed(f"{where}: {type(exc).__name__}: {exc}") from None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


async def _mark_connected(
    session: aiohttp.ClientSession, ctx: Any, params: aiohttp.TraceRequestHeadersSentParams
) -> None:
    extra = ctx.trace_request_ctx
    event = extra.get("connected") if isinstance(extra, dict) else None
    if event is not None:
        event.set()
