"""What ``--tracing`` costs a request: one whole ext_proc exchange in process (request
headers, body, scheduling over 8 endpoints, response headers and body, the stream's
end) through the real router and stream, without a tracer and with OpenTelemetry's SDK
(the spans batched, as ``epp serve --tracing`` does, into an in-memory exporter: the
OTLP encoding and the HTTP post happen in the SDK's background thread, off the request
path). Prints µs per request (median of rounds); docs/tracing.md reads it.

    python -m bench.tracing [--requests 2000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time

import orjson
from envoy.config.core.v3.base_pb2 import HeaderMap, HeaderValue
from envoy.service.ext_proc.v3.external_processor_pb2 import (
    HttpBody,
    HttpHeaders,
    ProcessingRequest,
)

from epp.config import build_scheduler
from epp.datastore import Datastore
from epp.extproc.stream import ExtProcStream
from epp.lifecycle.observers.tracing import Tracing
from epp.observability.metrics import EppMetrics
from epp.observability.tracing import Tracer
from epp.router import Router, StreamOptions
from epp.types import Endpoint
from tests.support.routers import make_router

BODY = orjson.dumps({"model": "m", "prompt": "Summarize the report. " * 40, "max_tokens": 8})
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def _headers(pairs: dict[str, str], end: bool = False) -> HttpHeaders:
    values = [HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs.items()]
    return HttpHeaders(headers=HeaderMap(headers=values), end_of_stream=end)


MESSAGES = [
    ProcessingRequest(
        request_headers=_headers(
            {":method": "POST", ":path": "/v1/completions", "traceparent": TRACEPARENT}
        )
    ),
    ProcessingRequest(request_body=HttpBody(body=BODY, end_of_stream=True)),
    ProcessingRequest(response_headers=_headers({":status": "200"})),
    ProcessingRequest(response_body=HttpBody(body=b'{"usage": {}}', end_of_stream=True)),
]


def router(tracer: Tracer | None) -> Router:
    ds = Datastore()
    for i in range(8):
        ds.add(Endpoint(f"10.0.0.{i + 1}", 8000))
    return make_router(
        ds,
        build_scheduler(""),
        EppMetrics(ds),
        stream=StreamOptions(1 << 20),
        rng=random.Random(0),
        observers=[] if tracer is None else [Tracing(tracer, "")],
    )


def per_request_us(r: Router, requests: int) -> float:
    start = time.perf_counter()
    for _ in range(requests):
        stream = ExtProcStream(r)
        for msg in MESSAGES:
            stream.on_message(msg)
        stream.close()
    return (time.perf_counter() - start) / requests * 1e6


def otel_tracer() -> Tracer:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from epp.observability.otel import OtelTracer

    provider = TracerProvider()
    # a queue that holds every span of a round, exported every 200 ms (none dropped)
    batch = BatchSpanProcessor(
        InMemorySpanExporter(), max_queue_size=1 << 16, schedule_delay_millis=200
    )
    provider.add_span_processor(batch)
    return OtelTracer(provider)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    tracer = otel_tracer()
    off, on = router(None), router(tracer)
    per_request_us(off, 200)  # warm up both
    per_request_us(on, 200)
    results: dict[str, list[float]] = {"off": [], "on": []}
    for _ in range(args.rounds):  # interleaved: the machine's drift hits both alike
        results["off"].append(per_request_us(off, args.requests))
        results["on"].append(per_request_us(on, args.requests))
    asyncio.run(tracer.close())
    median = {k: statistics.median(v) for k, v in results.items()}
    print(f"--tracing off: {median['off']:.1f} µs per request")
    print(f"--tracing on:  {median['on']:.1f} µs per request (+{median['on'] - median['off']:.1f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
