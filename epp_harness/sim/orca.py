"""ORCA load reports from the simulator, as vLLM sends them.

* Response header ``endpoint-load-metrics`` on non-streaming responses (vLLM adds none
  to streams) when the request carries ``endpoint-load-metrics-format: TEXT|JSON|BIN``
  or the simulator runs with ``--orca-format text|json|bin``.
* ``--orca-port``: ``xds.service.orca.v3.OpenRcaService/StreamCoreMetrics`` over
  grpc.aio in the simulator's own event loop, one report per requested interval.

Both carry vLLM's named metrics from the engine's live state. The encoders here are
written independently of the EPP's parser (``epp.datalayer.orca``) so tests of one
check the other. grpc and protobuf are imported only when used: a simulator without
ORCA starts as fast as before.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator, Mapping, MutableMapping
from typing import Any

import orjson

from epp_harness.sim.engine import Engine

FORMATS = ("none", "text", "json", "bin")
FORMAT_HEADER = "endpoint-load-metrics-format"
LOAD_HEADER = "endpoint-load-metrics"
STREAM_CORE_METRICS = "/xds.service.orca.v3.OpenRcaService/StreamCoreMetrics"
# Out-of-band reports are sent at most this often, whatever the client asks for.
MIN_REPORT_INTERVAL_S = 0.01


def named_metrics(engine: Engine) -> dict[str, float]:
    """vLLM's ORCA named metrics for the engine's current state."""
    return {
        "kv_cache_usage_perc": engine.kv_cache_usage,
        "num_requests_waiting": float(engine.waiting),
        "num_requests_running": float(engine.running),
    }


def response_format(request_headers: Mapping[str, str], default: str) -> str:
    """The format a response should use: the request's ``endpoint-load-metrics-format``
    (any case) if it names one, else the simulator's ``--orca-format``."""
    requested = request_headers.get(FORMAT_HEADER, "").strip().lower()
    return requested if requested in FORMATS else default


def load_header(fmt: str, metrics: Mapping[str, float]) -> str | None:
    """The ``endpoint-load-metrics`` value for ``metrics`` (named metrics) in ``fmt``,
    or None for ``none``."""
    if fmt == "text":
        return "TEXT " + ", ".join(f"named_metrics.{k}={v!r}" for k, v in metrics.items())
    if fmt == "json":
        return "JSON " + orjson.dumps({"named_metrics": dict(metrics)}).decode()
    if fmt == "bin":
        data = load_report(metrics).SerializeToString()
        return "BIN " + base64.b64encode(data).decode()
    return None


def load_report(metrics: Mapping[str, float]) -> Any:
    """An ``OrcaLoadReport`` carrying ``metrics`` as named metrics."""
    from xds.data.orca.v3.orca_load_report_pb2 import OrcaLoadReport

    return OrcaLoadReport(named_metrics=dict(metrics))


def add_load_header(
    response_headers: MutableMapping[str, str],
    request_headers: Mapping[str, str],
    default: str,
    engine: Engine,
) -> None:
    """Set ``endpoint-load-metrics`` on a non-streaming response if ORCA is wanted."""
    fmt = response_format(request_headers, default)
    if fmt == "none":  # the common case costs one header lookup
        return
    value = load_header(fmt, named_metrics(engine))
    if value is not None:
        response_headers[LOAD_HEADER] = value


class OrcaServer:
    """``OpenRcaService/StreamCoreMetrics`` for one engine, on grpc.aio."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._server: Any = None

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (0 = any free port); returns the bound port. Raises
        OSError when the address cannot be bound."""
        import grpc
        from xds.service.orca.v3.orca_pb2 import OrcaLoadReportRequest

        handler = grpc.method_handlers_generic_handler(
            "xds.service.orca.v3.OpenRcaService",
            {
                "StreamCoreMetrics": grpc.unary_stream_rpc_method_handler(
                    self._stream_core_metrics,
                    request_deserializer=OrcaLoadReportRequest.FromString,
                    response_serializer=lambda report: report.SerializeToString(),
                )
            },
        )
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((handler,))
        target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            bound = server.add_insecure_port(target)
        except RuntimeError as exc:  # grpc's "Failed to bind to address"
            raise OSError(f"cannot listen for ORCA on {target}: {exc}") from None
        await server.start()
        self._server = server
        return int(bound)

    async def stop(self) -> None:
        """Stop at once: open streams end (clients reconnect to whoever comes next)."""
        if self._server is not None:
            await self._server.stop(None)
            self._server = None

    async def _stream_core_metrics(self, request: Any, context: Any) -> AsyncIterator[Any]:
        interval = request.report_interval
        seconds = interval.seconds + interval.nanos / 1e9
        period = max(seconds, MIN_REPORT_INTERVAL_S)
        while True:
            yield load_report(named_metrics(self._engine))
            await asyncio.sleep(period)
