"""A real OTLP/HTTP trace receiver on a loopback port: ``POST /v1/traces`` with a
protobuf ``ExportTraceServiceRequest`` (the exporter's default encoding), decoded with
the classes opentelemetry-proto ships, kept as plain :class:`ReceivedSpan` records."""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


@dataclass(frozen=True)
class ReceivedSpan:
    service: str
    name: str
    trace_id: str  # 32 hex digits
    span_id: str  # 16 hex digits
    parent_span_id: str  # "" for a root span
    kind: int
    attributes: dict[str, Any]
    events: tuple[str, ...]
    status_code: int  # 0 unset, 1 ok, 2 error
    start_ns: int
    end_ns: int


class OtlpReceiver:
    """Collects every span exported to it; ``endpoint`` is what OTEL_EXPORTER_OTLP_ENDPOINT
    takes (the exporter appends /v1/traces)."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.requests = 0
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                if self.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces":
                    self.send_error(404)
                    return
                receiver.add(ExportTraceServiceRequest.FromString(body))
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"

    def add(self, export: ExportTraceServiceRequest) -> None:
        received = []
        for resource_spans in export.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for s in scope_spans.spans:
                    received.append(
                        ReceivedSpan(
                            service=str(resource.get("service.name", "")),
                            name=s.name,
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_span_id=s.parent_span_id.hex(),
                            kind=s.kind,
                            attributes={a.key: _value(a.value) for a in s.attributes},
                            events=tuple(e.name for e in s.events),
                            status_code=s.status.code,
                            start_ns=s.start_time_unix_nano,
                            end_ns=s.end_time_unix_nano,
                        )
                    )
        with self._lock:
            self.requests += 1
            self.spans.extend(received)

    def named(self, name: str, trace_id: str | None = None) -> list[ReceivedSpan]:
        with self._lock:
            return [
                s
                for s in self.spans
                if s.name == name and (trace_id is None or s.trace_id == trace_id)
            ]

    @contextmanager
    def running(self) -> Iterator[OtlpReceiver]:
        thread = threading.Thread(target=self._server.serve_forever, name="otlp", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._server.shutdown()
            self._server.server_close()
            thread.join(10)


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind)
