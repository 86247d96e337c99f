"""The llm-d Router's metric names, emitted beside ours so that dashboards and alerts
written for it work against this EPP (docs/metrics.md, "llm-d Router names").

Each series is exposed twice, as the llm-d Router does it: the canonical
``llm_d_epp_*`` name and the older one it still writes (``inference_objective_*``,
``inference_pool_*``, ``inference_extension_*``, ``llm_d_inference_scheduler_*``),
with their label sets and buckets; each event is written once, and both names are
rendered from that write at scrape time (:mod:`epp.observability.families`). Only
what this EPP knows is emitted: request totals, errors, duration, time to first
token, tokens, normalized time per output token, pool averages and ready endpoints,
scheduling latency and attempts, P/D decisions, build info. ``priority`` is ``0``
and ``fairness_id`` the request's ``x-llm-d-inference-fairness-id`` header (else
``default-flow``) until objectives and flow control exist; ``target_model_name`` is
the requested model (no rewrites here).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterator, Mapping, Sequence

from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from epp.datastore import Datastore
from epp.observability.families import Buckets, Cells, Key, Name, OneWrite

NEW = "llm_d_epp"
OBJECTIVE = "inference_objective"
POOL = "inference_pool"
EXTENSION = "inference_extension"
SCHEDULER = "llm_d_inference_scheduler"

FAIRNESS_HEADER = "x-llm-d-inference-fairness-id"
DEFAULT_FAIRNESS_ID = "default-flow"
PRIORITY = "0"
LABEL_CAP = 1000  # distinct model names / fairness ids before new ones read "other"
PD_HANDLER = "pd-profile-handler"

LATENCY_BUCKETS = (
    0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2, 3, 4, 5, 6,
    8, 10, 15, 20, 30, 45, 60, 120, 180, 240, 300, 360, 480, 600, 900, 1200,
    1800, 2700, 3600,
)  # fmt: skip
TTFT_BUCKETS = LATENCY_BUCKETS[:24]  # up to 120 s
INPUT_TOKEN_BUCKETS = (
    1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32778, 65536,
    131072, 262144, 524288, 1048576,
)  # fmt: skip
OUTPUT_TOKEN_BUCKETS = INPUT_TOKEN_BUCKETS[:12]  # up to 8192
NTPOT_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)
SCHEDULER_BUCKETS = (0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1)

MODEL = ["model_name", "target_model_name"]
REQUEST = [*MODEL, "fairness_id", "priority"]
DECISION = ["model_name", "decision_type"]

# our P/D decisions -> theirs
DECISIONS = {
    "disaggregated": "prefill-decode",
    "decode-only": "decode-only",
    "no-prefill-endpoint": "decode-only",
}
# HTTP status of a request we answered ourselves -> their error code
ERROR_CODES = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    412: "PreconditionFailed",
    413: "BadRequest",
    429: "ResourceExhausted",
    500: "Internal",
    503: "ServiceUnavailable",
}
MODEL_SERVER_ERROR = "ModelServerError"


class _Bounded:
    """Label values from clients, at most ``cap`` distinct ones; then ``other``."""

    def __init__(self, cap: int = LABEL_CAP) -> None:
        self._seen: set[str] = set()
        self._cap = cap

    def __call__(self, value: str) -> str:
        if value in self._seen:
            return value
        if len(self._seen) >= self._cap:
            return "other"
        self._seen.add(value)
        return value


def _request(key: Key) -> Key:
    """(model, fairness id) -> the canonical request labels."""
    return (key[0], key[0], key[1], PRIORITY)


def _legacy_request(key: Key) -> Key:
    return (key[0], key[0], PRIORITY)


def _model_target(key: Key) -> Key:
    return (key[0], key[0])


def _model(key: Key) -> Key:
    return (key[0],)


def _request_and(key: Key) -> Key:
    """(model, fairness id, one more: an error code, streaming) -> the canonical
    request labels and that one."""
    return (key[0], key[0], key[1], PRIORITY, key[2])


def _legacy_error(key: Key) -> Key:
    return (key[0], key[0], key[2])


def _attempt(key: Key) -> Key:
    """(model, host, port) -> the scheduling-attempt labels."""
    return ("success", key[0], key[1], "", key[2])


def _decision(key: Key) -> Key:
    """(model, decision type) -> the P/D decision labels."""
    return (PD_HANDLER, PD_HANDLER, key[0], key[1])


def _same(key: Key) -> Key:
    return key


class RouterNames:
    """Records each event once; both of the llm-d Router's names are rendered from that
    write when /metrics is read (:mod:`epp.observability.families`)."""

    def __init__(
        self, registry: CollectorRegistry, datastore: Datastore, pool: str, version: str
    ) -> None:
        one = OneWrite()

        def pair(name: str, old: str, doc: str, new_labels: Sequence[str],
                 new_values: Callable[[Key], Key], old_labels: Sequence[str],
                 old_values: Callable[[Key], Key]) -> tuple[Name, Name]:  # fmt: skip
            return (
                Name(f"{NEW}_{name}", doc, new_labels, new_values),
                Name(old, f"[Deprecated: use {NEW}_{name}] {doc}", old_labels, old_values),
            )

        self._requests = one.counter(*pair(
            "request_total", f"{OBJECTIVE}_request_total", "Total requests.",
            REQUEST, _request, [*MODEL, "priority"], _legacy_request,
        ))  # fmt: skip
        self._errors = one.counter(*pair(
            "request_error_total", f"{OBJECTIVE}_request_error_total",
            "Errored requests, by error code.", [*REQUEST, "error_code"], _request_and,
            [*MODEL, "error_code"], _legacy_error,
        ))  # fmt: skip

        def per_request(buckets: Sequence[float], name: str, old: str, doc: str) -> Cells[Buckets]:
            """A histogram of requests; its older name has the model labels only."""
            names = pair(name, old, doc, REQUEST, _request, MODEL, _model_target)
            return one.histogram(buckets, *names)

        self._duration = per_request(
            LATENCY_BUCKETS, "request_duration_seconds", f"{OBJECTIVE}_request_duration_seconds",
            "End-to-end request latency in seconds (routing to the response's end).",
        )  # fmt: skip
        self._input = per_request(
            INPUT_TOKEN_BUCKETS, "request_input_tokens", f"{OBJECTIVE}_input_tokens",
            "Input (prompt) tokens, from the response's usage.",
        )  # fmt: skip
        self._output = per_request(
            OUTPUT_TOKEN_BUCKETS, "request_output_tokens", f"{OBJECTIVE}_output_tokens",
            "Output (completion) tokens, from the response's usage.",
        )  # fmt: skip
        self._cached = per_request(
            INPUT_TOKEN_BUCKETS, "request_cached_tokens", f"{OBJECTIVE}_prompt_cached_tokens",
            "Prompt tokens served from the engine's cache, from the response's usage.",
        )  # fmt: skip
        self._ntpot = per_request(
            NTPOT_BUCKETS, "request_ntpot_seconds",
            f"{OBJECTIVE}_normalized_time_per_output_token_seconds",
            "Request latency divided by its output tokens, in seconds.",
        )  # fmt: skip
        self._running = one.gauge(*pair(
            "request_running", f"{OBJECTIVE}_running_requests",
            "Requests in flight: routed, their response not finished.", REQUEST, _request,
            ["model_name"], _model,
        ))  # fmt: skip
        self._ttft = one.histogram(TTFT_BUCKETS, Name(
            f"{NEW}_request_ttft_seconds",
            "Time to first token in seconds: routing to the response body's first bytes.",
            [*REQUEST, "streaming"], _request_and,
        ))  # fmt: skip
        self._scheduling = one.histogram(SCHEDULER_BUCKETS, *pair(
            "scheduler_e2e_duration_seconds", f"{EXTENSION}_scheduler_e2e_duration_seconds",
            "End-to-end scheduling latency in seconds.", [], _same, [], _same,
        )).at(())  # fmt: skip
        self._attempts = one.counter(*pair(
            "scheduler_attempts_total", f"{EXTENSION}_scheduler_attempts_total",
            "Scheduling attempts, by status and chosen endpoint.",
            ["status", "target_model_name", "endpoint_name", "namespace", "port"], _attempt,
            ["status", "target_model_name", "pod_name", "namespace", "port"], _attempt,
        ))  # fmt: skip
        # the four names of a P/D decision, all counted by one write
        self._decisions = one.counter(
            *pair("pd_decision_total", f"{SCHEDULER}_pd_decision_total",
                  "P/D disaggregation decisions.", ["plugin_name", "plugin_type", *DECISION],
                  _decision, DECISION, _same),
            *pair("disagg_decision_total", f"{SCHEDULER}_disagg_decision_total",
                  "Disaggregation routing decisions.", ["plugin_name", "plugin_type", *DECISION],
                  _decision, DECISION, _same),
        )  # fmt: skip
        registry.register(one)
        for info in (
            Gauge(f"{NEW}_info", "Build info.", ["commit", "build_ref"], registry=registry),
            Gauge(f"{EXTENSION}_info", f"[Deprecated: use {NEW}_info] Build info.",
                  ["commit", "build_ref"], registry=registry),
        ):  # fmt: skip
            info.labels("", version).set(1)
        registry.register(_PoolCollector(datastore, pool))
        self._models = _Bounded()
        self._fairness = _Bounded()

    def labels_of(self, model: str | None, headers: Mapping[str, str]) -> tuple[str, str]:
        """The (bounded) model and fairness id a request is recorded under."""
        fairness = headers.get(FAIRNESS_HEADER) or DEFAULT_FAIRNESS_ID
        return self._models(model or ""), self._fairness(fairness)

    def routed(
        self, model: str, fairness: str, seconds: float, address: str, decision: str
    ) -> None:
        self._requests.at((model, fairness)).inc()
        self._scheduling.observe(seconds)
        host, _, port = address.rpartition(":")
        self._attempts.at((model, host, port)).inc()
        theirs = DECISIONS.get(decision)
        if theirs is not None:
            self._decisions.at((model, theirs)).inc()

    def started(self, model: str, fairness: str) -> Callable[[], None]:
        """A routed request is in flight; returns what to call once when it is not."""
        running = self._running.at((model, fairness))
        running.inc()
        return running.dec

    def failed(self, model: str, fairness: str, status: int, *, ours: bool) -> None:
        """A request that ended in an error status: one we answered (``ours``), or a
        model server's non-200 answer."""
        code = ERROR_CODES.get(status, "Unknown") if ours else MODEL_SERVER_ERROR
        self._errors.at((model, fairness, code)).inc()

    def first_byte(self, model: str, fairness: str, seconds: float, streaming: bool) -> None:
        streamed = "true" if streaming else "false"
        self._ttft.at((model, fairness, streamed)).observe(seconds)

    def completed(
        self,
        model: str,
        fairness: str,
        seconds: float,
        tokens: tuple[int, int, int | None] | None,
    ) -> None:
        """A response passed whole: its latency, and (prompt, completion, cached)
        tokens when its usage said."""
        key = (model, fairness)
        self._duration.at(key).observe(seconds)
        if tokens is None:
            return
        prompt, completion, cached = tokens
        self._input.at(key).observe(prompt)
        self._output.at(key).observe(completion)
        if cached is not None:
            self._cached.at(key).observe(cached)
        if completion > 0:
            self._ntpot.at(key).observe(seconds / completion)


class _PoolCollector(Collector):
    """Pool averages read from the datastore at scrape time, under both names."""

    def __init__(self, datastore: Datastore, pool: str) -> None:
        self._datastore = datastore
        self._pool = pool

    def collect(self) -> Iterator[GaugeMetricFamily]:
        snapshot = self._datastore.snapshot()
        reports = [s.metrics for s in snapshot.endpoints if s.metrics is not None]
        kv = [float(m.kv_usage) for m in reports if m.kv_usage is not None]
        queue = [float(m.waiting) for m in reports if m.waiting is not None]
        # this process's own (the workers' pages are summed; peers would count twice)
        own = self._datastore.own_in_flight
        running = [float(own.get(s.address, 0)) for s in snapshot.endpoints]
        series: list[tuple[str, str | None, str, Callable[[], float]]] = [
            ("average_kv_cache_utilization", f"{POOL}_average_kv_cache_utilization",
             "Mean KV-cache utilization (0..1) over the pool's endpoints that report it.",
             lambda: _mean(kv)),
            ("average_queue_size", f"{POOL}_average_queue_size",
             "Mean queue depth (requests waiting) over the pool's endpoints.",
             lambda: _mean(queue)),
            ("average_running_requests", f"{POOL}_average_running_requests",
             "Mean requests in flight per endpoint, as this EPP counts them.",
             lambda: _mean(running)),
            ("std_dev_kv_cache_utilization", None, "Spread of KV-cache utilization.",
             lambda: _stdev(kv)),
            ("std_dev_queue_size", None, "Spread of queue depth.", lambda: _stdev(queue)),
            ("std_dev_running_requests", None, "Spread of requests in flight.",
             lambda: _stdev(running)),
            ("ready_endpoints", f"{POOL}_ready_pods",
             "Endpoints the scheduler can pick (healthy members).",
             lambda: float(len(snapshot.endpoints))),
        ]  # fmt: skip
        for name, old, doc, value in series:
            v = value()
            current = GaugeMetricFamily(f"{NEW}_{name}", doc, labels=["name"])
            current.add_metric([self._pool], v)
            yield current
            if old is not None:
                legacy = GaugeMetricFamily(
                    old, f"[Deprecated: use {NEW}_{name}] {doc}", labels=["name"]
                )
                legacy.add_metric([self._pool], v)
                yield legacy
        per_endpoint = GaugeMetricFamily(
            f"{NEW}_per_endpoint_queue_size",
            "Queue depth of each endpoint, as last reported.",
            labels=["name", "model_server_endpoint"],
        )
        for state in snapshot.endpoints:
            if state.metrics is not None and state.metrics.waiting is not None:
                per_endpoint.add_metric([self._pool, state.address], state.metrics.waiting)
        yield per_endpoint


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else 0.0


def _stdev(values: list[float]) -> float:
    return statistics.pstdev(values) if values else 0.0
