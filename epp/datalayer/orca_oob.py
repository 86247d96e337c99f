"""Out-of-band ORCA: one ``OpenRcaService/StreamCoreMetrics`` stream per endpoint.

For every endpoint that ``port_for`` gives an ORCA port, a task (via EndpointTasks, so
it follows membership) opens an insecure grpc.aio channel to ``host:port``, asks for a
report every ``report_interval_s`` and merges each report into the datastore as it
arrives. When the stream fails or ends it reconnects after a backoff of 0.1 s doubling
up to 5 s, reset by every report received; nothing here ever raises out of the task.

xds-protos ships the message classes but no stub for OpenRcaService, so the call is
made with grpc's generic ``unary_stream`` and the messages' own (de)serializers.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.duration_pb2 import Duration
from xds.data.orca.v3.orca_load_report_pb2 import OrcaLoadReport
from xds.service.orca.v3.orca_pb2 import OrcaLoadReportRequest

from epp.datalayer.orca import OrcaParseError, merge_orca, report_to_dict
from epp.datalayer.tasks import EndpointTasks
from epp.datastore import Datastore
from epp.observability.metrics import EppMetrics
from epp.types import Endpoint

log = logging.getLogger(__name__)

STREAM_CORE_METRICS = "/xds.service.orca.v3.OpenRcaService/StreamCoreMetrics"
INITIAL_BACKOFF_S = 0.1
MAX_BACKOFF_S = 5.0
# A fresh subchannel per attempt: grpc's shared subchannel pool would otherwise keep
# its own (longer, growing) reconnect backoff across our channels.
_CHANNEL_OPTIONS = (("grpc.use_local_subchannel_pool", 1),)


def orca_target(host: str, port: int) -> str:
    """``host:port`` for grpc (IPv6 hosts bracketed)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass(slots=True)
class _Attempt:
    """One endpoint's connection attempts: where to, and reports in the current one."""

    target: str
    reports: int = 0  # in the current stream
    failures: int = 0  # streams in a row that ended without a report


class OrcaStreams:
    """Keeps an ORCA stream open to every endpoint that has an ORCA port."""

    def __init__(
        self,
        datastore: Datastore,
        eppmetrics: EppMetrics,
        *,
        port_for: Callable[[Endpoint], int | None],
        report_interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not report_interval_s > 0:
            raise ValueError(f"report_interval_s must be > 0, got {report_interval_s}")
        self._datastore = datastore
        self._port_for = port_for
        self._clock = clock
        self._ok = eppmetrics.orca_reports.labels("oob", "ok")
        self._malformed = eppmetrics.orca_reports.labels("oob", "malformed")
        seconds = int(report_interval_s)
        self._request = OrcaLoadReportRequest(
            report_interval=Duration(
                seconds=seconds, nanos=round((report_interval_s - seconds) * 1e9)
            )
        )
        self._streaming: set[str] = set()
        self._tasks = EndpointTasks("orca-oob", datastore, self._follow)

    def start(self) -> None:
        """Start following the datastore's endpoints (call from the event loop)."""
        self._tasks.start()

    async def stop(self) -> None:
        """Cancel every stream and close its channel."""
        await self._tasks.stop()
        self._streaming.clear()

    def streaming(self) -> list[str]:
        """Endpoints whose stream is open and has delivered a report (tests, /status)."""
        return sorted(self._streaming)

    async def _follow(self, endpoint: Endpoint) -> None:
        port = self._port_for(endpoint)
        if port is None:
            return
        attempt = _Attempt(orca_target(endpoint.host, port))
        backoff = INITIAL_BACKOFF_S
        while True:
            attempt.reports = 0
            try:
                await self._stream(endpoint, attempt)
                problem = "ended"
            except asyncio.CancelledError:
                raise
            except grpc.aio.AioRpcError as exc:
                problem = f"failed: {exc.code().name} {exc.details()}"
            except Exception as exc:  # never let one endpoint's stream take anything down
                log.debug("ORCA stream to %s", attempt.target, exc_info=True)
                problem = f"failed: {type(exc).__name__}: {exc}"
            finally:
                self._streaming.discard(endpoint.address)
            if attempt.reports:
                backoff = INITIAL_BACKOFF_S
                attempt.failures = 0
            attempt.failures += 1
            # Say so once per outage; retries of a server that stays down go to debug.
            level = logging.WARNING if attempt.failures == 1 else logging.DEBUG
            log.log(
                level,
                "ORCA stream to %s (%s) %s; retrying in %.1fs",
                attempt.target,
                endpoint.address,
                problem,
                backoff,
            )
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF_S)

    async def _stream(self, endpoint: Endpoint, attempt: _Attempt) -> None:
        """Read one stream until it ends, counting reports in ``attempt``."""
        async with grpc.aio.insecure_channel(attempt.target, options=_CHANNEL_OPTIONS) as channel:
            call = channel.unary_stream(
                STREAM_CORE_METRICS,
                request_serializer=OrcaLoadReportRequest.SerializeToString,
                response_deserializer=OrcaLoadReport.FromString,
            )(self._request)
            # Leaving the block (end, error or cancel) closes the channel and cancels
            # the call.
            async for report in call:
                if attempt.reports == 0 and attempt.failures:
                    log.info("ORCA stream to %s is back", attempt.target)
                attempt.reports += 1
                self._streaming.add(endpoint.address)
                self._on_report(endpoint, report)

    def _on_report(self, endpoint: Endpoint, report: Any) -> None:
        try:
            values = report_to_dict(report)
        except OrcaParseError as exc:
            self._malformed.inc()
            log.warning("malformed ORCA report from %s: %s", endpoint.address, exc)
            return
        state = self._datastore.get(endpoint.address)
        if state is None:  # left the pool; its task is being cancelled
            return
        self._datastore.update_metrics(
            endpoint.address, merge_orca(state.metrics, values, self._clock())
        )
        self._ok.inc()
