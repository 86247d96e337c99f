"""gRPC health (``grpc.health.v1.Health``: ``Check`` and ``Watch``) over a status table.

Its two messages are one field each, so they are read and written here by hand: the
generated ``grpc.health.v1`` modules of grpcio and grpclib cannot share a process, and
this transport must work beside either (tests run grpcio clients against it)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from epp.extproc.native.grpc import INVALID_ARGUMENT, NOT_FOUND, Call, GrpcError, Method

SERVICE = "grpc.health.v1.Health"
UNKNOWN, SERVING, NOT_SERVING, SERVICE_UNKNOWN = 0, 1, 2, 3


class HealthCheckRequest:
    __slots__ = ("service",)

    def __init__(self, service: str) -> None:
        self.service = service

    @classmethod
    def parse(cls, data: Any) -> HealthCheckRequest:
        """Field 1 (``service``, a string); other fields skipped. Raises ValueError."""
        data = bytes(data)
        service = ""
        at = 0
        while at < len(data):
            key, at = _varint(data, at)
            wire = key & 7
            if wire == 0:
                _, at = _varint(data, at)
            elif wire == 2:
                size, at = _varint(data, at)
                if at + size > len(data):
                    raise ValueError("field past the end")
                if key >> 3 == 1:
                    service = data[at : at + size].decode()
                at += size
            elif wire in (1, 5):
                at += 8 if wire == 1 else 4
            else:
                raise ValueError(f"wire type {wire}")
        if at != len(data):
            raise ValueError("field past the end")
        return cls(service)


class HealthCheckResponse:
    __slots__ = ("status",)

    def __init__(self, status: int) -> None:
        self.status = status

    def SerializeToString(self) -> bytes:
        return bytes((0x08, self.status)) if self.status else b""


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data) or shift > 63:
            raise ValueError("varint cut short")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, at


class Health:
    """Statuses by service name; ``Watch`` streams each change."""

    def __init__(self) -> None:
        self._status: dict[str, int] = {}
        self._changed = asyncio.Event()
        self._closed = False

    def set(self, serving: bool, names: Iterable[str]) -> None:
        for name in names:
            self._status[name] = SERVING if serving else NOT_SERVING
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def close(self) -> None:
        """End every Watch (its client sees the stream end OK), so that a shutdown's
        drain does not wait for them: they never end by themselves."""
        self._closed = True
        self._changed.set()

    def methods(self) -> dict[str, Method]:
        return {
            f"/{SERVICE}/Check": Method(HealthCheckRequest.parse, self._check),
            f"/{SERVICE}/Watch": Method(HealthCheckRequest.parse, self._watch),
        }

    async def _check(self, call: Call[HealthCheckRequest]) -> None:
        request = await call.recv()
        if request is None:
            raise GrpcError(INVALID_ARGUMENT, "no request message")
        status = self._status.get(request.service)
        if status is None:
            raise GrpcError(NOT_FOUND, f"unknown service {request.service!r}")
        await call.send(HealthCheckResponse(status))

    async def _watch(self, call: Call[HealthCheckRequest]) -> None:
        request = await call.recv()
        if request is None:
            raise GrpcError(INVALID_ARGUMENT, "no request message")
        sent = None
        while not self._closed:  # until the client cancels, or the server stops
            changed = self._changed
            status = self._status.get(request.service, SERVICE_UNKNOWN)
            if status != sent:
                await call.send(HealthCheckResponse(status))
                sent = status
            await changed.wait()
