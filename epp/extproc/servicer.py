"""grpc.aio binding of the ext_proc service: feeds each stream's messages through an
:class:`ExtProcStream` and releases its claims however the stream ends."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from envoy.service.ext_proc.v3 import external_processor_pb2_grpc
from envoy.service.ext_proc.v3.external_processor_pb2 import ProcessingRequest, ProcessingResponse

from epp.extproc.stream import ExtProcStream
from epp.router import Router

SERVICE_NAME = "envoy.service.ext_proc.v3.ExternalProcessor"


class ExtProcServicer(external_processor_pb2_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    def __init__(self, router: Router) -> None:
        self._router = router

    async def Process(
        self, request_iterator: AsyncIterator[ProcessingRequest], context: Any
    ) -> AsyncIterator[ProcessingResponse]:
        stream = ExtProcStream(self._router)
        try:
            async for msg in request_iterator:
                for reply in stream.on_message(msg):
                    yield reply
        finally:
            # EOF, client cancel (CancelledError / GeneratorExit) or error: all end here.
            stream.close()


def add_to_server(server: Any, router: Router) -> None:
    external_processor_pb2_grpc.add_ExternalProcessorServicer_to_server(
        ExtProcServicer(router), server
    )
