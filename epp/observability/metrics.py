"""The EPP's own Prometheus metrics, in a registry owned by the running service.

At the bottom of the layers: every part that counts something imports it. What it reads
at scrape time from higher layers (the prefix indexes, the latency model) it sees through
the two small Protocols below."""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Protocol, Self

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.registry import Collector

from epp import __version__
from epp.datastore import Datastore
from epp.observability.llmdmetrics import RouterNames

# How long an endpoint's own series (epp_responses_total, epp_scrape_failures_total)
# outlive its removal from the pool, so the scrapes after it still see the final counts.
SERIES_GRACE_S = 600.0
# the llm-d Router's buckets for the time requests spend in flow control
FLOW_QUEUE_BUCKETS = (
    1e-4,
    5e-4,
    1e-3,
    5e-3,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
)


class _Kept(MetricWrapperBase):
    """Keeps a labelled metric's children by their label values, so that ``labels()``
    on the request path is one dict lookup (prometheus_client's own converts the
    values and takes a lock on every call). Removing or clearing series forgets them."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._kept: dict[tuple[object, ...], Self] = {}
        super().__init__(*args, **kwargs)

    def labels(self, *labelvalues: object, **labelkwargs: object) -> Self:
        if labelkwargs:
            return super().labels(*labelvalues, **labelkwargs)
        child = self._kept.get(labelvalues)
        if child is None:
            child = self._kept[labelvalues] = super().labels(*labelvalues)
        return child

    def remove(self, *labelvalues: Any) -> None:
        self._kept.clear()
        super().remove(*labelvalues)

    def remove_by_labels(self, labels: dict[str, str]) -> None:
        self._kept.clear()
        super().remove_by_labels(labels)

    def clear(self) -> None:
        self._kept.clear()
        super().clear()


class KeptCounter(_Kept, Counter):
    """A Counter whose children are kept (:class:`_Kept`)."""


class KeptHistogram(_Kept, Histogram):
    """A Histogram whose children are kept (:class:`_Kept`)."""


class SizedIndex(Protocol):
    """A prefix-cache index (:class:`epp.scheduling.prefixindex.PrefixIndex`)."""

    def size(self) -> int:
        """Blocks held across all endpoints."""
        ...


class TokenRatioView(Protocol):
    """Characters per token as learned (:class:`epp.scheduling.latency.TokenRatio`)."""

    @property
    def chars_per_token(self) -> float: ...


class LearnedLatency(Protocol):
    """The latency model (:class:`epp.scheduling.latency.LatencyModel`)."""

    @property
    def tokens(self) -> TokenRatioView:
        """The servers' characters per prompt token, as learned."""
        ...

    def addresses(self) -> Iterable[str]:
        """The endpoints it has values for."""
        ...

    def status(self, address: str) -> Mapping[str, float | int | None] | None:
        """The endpoint's learned values by name (None: never seen)."""
        ...


class EppMetrics:
    def __init__(
        self,
        datastore: Datastore,
        *,
        pool_name: str = "default",
        series_grace_s: float = SERIES_GRACE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        # the standard process_* and python_* series
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        # the llm-d Router's names for what is counted here (``pool_name``: their
        # ``name`` label of pool series)
        self.llmd = RouterNames(self.registry, datastore, pool_name, __version__)
        self.requests = KeptCounter(
            "epp_requests",
            "Requests seen by the EPP, by outcome: routed (an inference request: a "
            "scheduling decision), forwarded (no body, e.g. GET /v1/models: sent to an "
            "endpoint, not a decision) or the HTTP error status sent.",
            ["outcome"],
            registry=self.registry,
        )
        self.streams = KeptCounter(
            "epp_extproc_streams",
            "ext_proc streams ended, by how: complete (Envoy half-closed it), cancelled "
            "(Envoy reset it: an Envoy without ext_proc graceful close, or one that gave "
            "up), ended (grpcio transport: either of the two), abandoned (it ended before "
            "the response did: the client hung up, or Envoy gave up on the upstream), "
            "error (our handler failed, or ended a stream that broke the protocol).",
            ["end"],
            registry=self.registry,
        )
        self.stream_stalls = Counter(
            "epp_stream_stalls",
            "Streamed responses the EPP ended because their model server sent nothing "
            "for the chunk timeout after the first byte (epp serve --stream-chunk-timeout).",
            registry=self.registry,
        )
        self.open_streams = Gauge(
            "epp_extproc_open_streams",
            "ext_proc streams open now (one per request Envoy is still processing with "
            "the EPP, from its headers until the stream ends, however it ends; "
            "epp_extproc_streams_total counts them as they end).",
            registry=self.registry,
        )
        self.responses = KeptCounter(
            "epp_responses",
            "Upstream responses seen on the response path, by endpoint and status class.",
            ["endpoint", "status_class"],
            registry=self.registry,
        )
        self.tokens = KeptCounter(
            "epp_tokens",
            "Tokens reported in responses' usage, by kind (prompt or completion).",
            ["kind"],
            registry=self.registry,
        )
        self.scheduling_seconds = Histogram(
            "epp_scheduling_duration_seconds",
            "Time spent choosing endpoints for one request.",
            buckets=(1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 1e-2, 0.1),
            registry=self.registry,
        )
        self.scrapes = Counter(
            "epp_scrapes",
            "/metrics scrapes started, over all endpoints (failures are counted again "
            "in epp_scrape_failures_total).",
            registry=self.registry,
        )
        self.scrape_failures = KeptCounter(
            "epp_scrape_failures",
            "Failed /metrics scrapes of a model server (connect error, timeout, bad status "
            "or unparsable text), by endpoint.",
            ["endpoint"],
            registry=self.registry,
        )
        self.orca_reports = KeptCounter(
            "epp_orca_reports",
            "ORCA load reports received, by source (header, oob) and result (ok, malformed).",
            ["source", "result"],
            registry=self.registry,
        )
        self.pd_decisions = KeptCounter(
            "epp_pd_decisions",
            "Prefill/decode decisions, by decision (disaggregated, decode-only, "
            "no-prefill-endpoint).",
            ["decision"],
            registry=self.registry,
        )
        self.deferred_decodes = KeptCounter(
            "epp_deferred_decode_picks",
            "Decode endpoints picked after the prefill leg (deferred decode selection), by "
            "pick: same = the endpoint the first pick named, moved = another one, none = "
            "no endpoint could decode (503).",
            ["pick"],
            registry=self.registry,
        )
        self.prefill_legs = KeptCounter(
            "epp_prefill_legs",
            "Prefill legs run by the EPP, by coordinator and outcome (ok, failed = decode "
            "alone, rejected = client error returned, no_kv_params = decode alone).",
            ["coordinator", "outcome"],
            registry=self.registry,
        )
        self.prefill_leg_seconds = KeptHistogram(
            "epp_prefill_leg_duration_seconds",
            "Time of prefill legs run by the EPP (request sent to response read).",
            ["coordinator"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=self.registry,
        )
        self.ttft_error = Histogram(
            "epp_ttft_prediction_error_seconds",
            "Observed minus predicted time to first token of streamed requests (the "
            "latency model's error; negative = faster than predicted).",
            buckets=(-1, -0.25, -0.1, -0.05, -0.02, -0.01, 0, 0.01, 0.02, 0.05, 0.1, 0.25, 1),
            registry=self.registry,
        )
        self.slo_predictions = KeptCounter(
            "epp_slo_predictions",
            "Requests with SLO headers, by whether the chosen endpoint was predicted to "
            "meet them (met, missed: no endpoint could; best effort).",
            ["prediction"],
            registry=self.registry,
        )
        self.lora_loads = KeptCounter(
            "epp_lora_adapter_loads",
            "LoRA adapters the EPP asked a server to load (placement or admin API), by "
            "result (ok, failed).",
            ["result"],
            registry=self.registry,
        )
        self.lora_unloads = KeptCounter(
            "epp_lora_adapter_unloads",
            "LoRA adapters the EPP asked a server to unload (least recently used, or admin "
            "API), by result (ok, failed).",
            ["result"],
            registry=self.registry,
        )
        self.lora_waited = Counter(
            "epp_lora_requests_waited_for_load",
            "Requests that waited for their adapter to be loaded before being routed.",
            registry=self.registry,
        )
        self.config_reloads = KeptCounter(
            "epp_config_reloads",
            "Reloads of the --config file (on SIGHUP or a changed file), by result: "
            "success (the new config runs) or failure (the previous one still runs; the "
            "log says why).",
            ["result"],
            registry=self.registry,
        )
        # flow control, under the llm-d Router's names and labels (docs/flow-control.md)
        self.flow_queue_seconds = KeptHistogram(
            "llm_d_epp_flow_control_request_queue_duration_seconds",
            "Time requests spent in flow control, from arrival to their outcome "
            "(Dispatched, RejectedCapacity, RejectedOther, EvictedTTL, "
            "EvictedContextCancelled, EvictedCapacity, EvictedOther), by fairness id and "
            "priority. A request dispatched at once counts as Dispatched after 0 s.",
            ["fairness_id", "priority", "outcome"],
            buckets=FLOW_QUEUE_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(_DatastoreCollector(datastore))
        # per-endpoint series stay while their endpoint is a member, whatever its status
        # (an ejected endpoint's failures are the interesting ones), and go
        # series_grace_s after it left the pool (membership changes at runtime)
        self._datastore = datastore
        self._grace_s = series_grace_s
        self._clock = clock
        self._known: set[str] = set()
        self._leaving: dict[str, float] = {}  # removed address -> when its series go
        datastore.on_change(self.expire_series)

    def watch_gc(self) -> Callable[[], None]:
        """Time every pass of Python's cyclic garbage collector (it stops the event loop)
        into ``epp_gc_pause_seconds{generation}``. Returns the function that stops it."""
        pauses = Histogram(
            "epp_gc_pause_seconds",
            "Pauses of Python's cyclic garbage collector (the event loop waits), by "
            "generation (2 = a full pass).",
            ["generation"],
            buckets=(1e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25),
            registry=self.registry,
        )
        by_generation = [pauses.labels(str(g)) for g in range(3)]
        started = [0.0]

        def timed(phase: str, info: dict[str, Any]) -> None:
            if phase == "start":
                started[0] = time.perf_counter()
            else:
                by_generation[info["generation"]].observe(time.perf_counter() - started[0])

        gc.callbacks.append(timed)
        return lambda: gc.callbacks.remove(timed)

    def report_scrape_interval(self, interval: Callable[[], float]) -> None:
        """Export the scrape interval in force (read at scrape time), once a scraper runs."""
        gauge = Gauge(
            "epp_scrape_interval_seconds",
            "Seconds between two /metrics scrapes of one endpoint: scrapeIntervalSeconds, "
            "or longer when the pool is too large for maxScrapesPerSecond.",
            registry=self.registry,
        )
        gauge.set_function(interval)

    def report_prefix_indexes(self, indexes: Callable[[], Mapping[str, SizedIndex]]) -> None:
        """Export the size of each prefix-cache scorer's index (by plugin name), read at
        scrape time (from the scheduler running then): the index is bounded per
        endpoint, and this shows by how much."""
        self.registry.register(_PrefixIndexCollector(indexes))

    def report_latency_model(self, model: LearnedLatency) -> None:
        """Export what the latency model has learned per endpoint, read at scrape time."""
        self.registry.register(_LatencyCollector(model))

    def report_flow_queues(
        self, sizes: Callable[[], Mapping[tuple[int, str], tuple[int, int]]]
    ) -> None:
        """Export flow control's queues ((band, flow) -> (requests, bytes)), read at
        scrape time."""
        self.registry.register(_FlowQueueCollector(sizes))

    def expire_series(self) -> None:
        """Note removed endpoints and drop the series of those gone longer than the
        grace (called on every membership change and before every /metrics answer)."""
        now = self._clock()
        current = {m.address for m in self._datastore.members()}
        for address in self._known - current:
            self._leaving.setdefault(address, now + self._grace_s)
        self._known = current
        for address, until in list(self._leaving.items()):
            if address in current:  # back before its series went
                del self._leaving[address]
            elif until <= now:
                del self._leaving[address]
                self._forget(address)

    def _forget(self, address: str) -> None:
        for counter, labels in (
            (self.scrape_failures, [(address,)]),
            (self.responses, [(address, f"{c}xx") for c in range(1, 6)]),
        ):
            for values in labels:
                with contextlib.suppress(KeyError):
                    counter.remove(*values)


class _DatastoreCollector(Collector):
    """Reads live state at scrape time, so the hot path never updates gauges."""

    def __init__(self, datastore: Datastore) -> None:
        self._datastore = datastore

    def collect(self) -> Iterator[GaugeMetricFamily]:
        snapshot = self._datastore.snapshot()
        endpoints = GaugeMetricFamily(
            "epp_endpoints", "Endpoints in the pool, by role.", labels=["role"]
        )
        counts: dict[str, int] = {}
        for state in snapshot.endpoints:
            role = state.endpoint.role.value
            counts[role] = counts.get(role, 0) + 1
        for role, n in sorted(counts.items()):
            endpoints.add_metric([role], n)
        yield endpoints
        in_flight = GaugeMetricFamily(
            "epp_in_flight_requests",
            "Requests this process routed to an endpoint and not yet finished (its "
            "peers' are in epp_peer_in_flight_requests).",
            labels=["endpoint"],
        )
        for address, n in sorted(self._datastore.own_in_flight.items()):
            in_flight.add_metric([address], n)
        yield in_flight
        yield GaugeMetricFamily(
            "epp_pending_decode_requests",
            "Requests whose prefill leg runs before their decode endpoint is chosen "
            "(deferred decode selection).",
            value=self._datastore.pending,
        )
        status = GaugeMetricFamily(
            "epp_endpoint_status",
            "1 for each member of the pool with its status (waiting, healthy, ejected, draining).",
            labels=["endpoint", "status"],
        )
        for member in self._datastore.members():
            status.add_metric([member.address, member.status.value], 1)
        yield status
        # what the scheduler believes about each endpoint (last scrape / ORCA report)
        waiting = GaugeMetricFamily(
            "epp_endpoint_queue_depth", "Requests waiting, as last reported.", labels=["endpoint"]
        )
        kv = GaugeMetricFamily(
            "epp_endpoint_kv_cache_usage",
            "KV-cache use 0..1, as last reported.",
            labels=["endpoint"],
        )
        age = GaugeMetricFamily(
            "epp_endpoint_metrics_age_seconds",
            "Seconds since the endpoint last reported load.",
            labels=["endpoint"],
        )
        now = time.monotonic()
        for state in snapshot.endpoints:
            m = state.metrics
            if m is None:
                continue
            if m.waiting is not None:
                waiting.add_metric([state.address], m.waiting)
            if m.kv_usage is not None:
                kv.add_metric([state.address], m.kv_usage)
            age.add_metric([state.address], max(now - m.updated_at, 0.0))
        yield waiting
        yield kv
        yield age


class _PrefixIndexCollector(Collector):
    def __init__(self, indexes: Callable[[], Mapping[str, SizedIndex]]) -> None:
        self._indexes = indexes

    def collect(self) -> Iterator[GaugeMetricFamily]:
        indexes = self._indexes()
        if not indexes:  # no prefix-cache scorer configured: no such metric
            return
        blocks = GaugeMetricFamily(
            "epp_prefix_index_blocks",
            "Prompt blocks the prefix-cache index remembers, summed over endpoints "
            "(its memory is proportional to this), by plugin.",
            labels=["plugin"],
        )
        for name, index in sorted(indexes.items()):
            blocks.add_metric([name], index.size())
        yield blocks


class _LatencyCollector(Collector):
    def __init__(self, model: LearnedLatency) -> None:
        self._model = model

    def collect(self) -> Iterator[GaugeMetricFamily]:
        learned = GaugeMetricFamily(
            "epp_latency_model",
            "The latency model's current values per endpoint, by parameter "
            "(overhead_ms, prefill_ms_per_token, decode_ms_per_token, "
            "decode_ms_per_running, slot_s, slots, ttft_abs_error_ms).",
            labels=["endpoint", "parameter"],
        )
        for address in sorted(self._model.addresses()):
            values = self._model.status(address) or {}
            for name, value in values.items():
                if value is not None and name not in ("ttft_samples", "completions"):
                    learned.add_metric([address, name], float(value))
        yield learned
        yield GaugeMetricFamily(
            "epp_prompt_chars_per_token",
            "Characters of prompt text per engine token, learned from the servers' "
            "usage reports (4 until they report): what token estimates divide by.",
            value=self._model.tokens.chars_per_token,
        )


class _FlowQueueCollector(Collector):
    def __init__(self, sizes: Callable[[], Mapping[tuple[int, str], tuple[int, int]]]) -> None:
        self._sizes = sizes

    def collect(self) -> Iterator[GaugeMetricFamily]:
        labels = ["fairness_id", "priority"]
        size = GaugeMetricFamily(
            "llm_d_epp_flow_control_queue_size",
            "Requests held by flow control, by fairness id and priority.",
            labels=labels,
        )
        held = GaugeMetricFamily(
            "llm_d_epp_flow_control_queue_bytes",
            "Request body bytes held by flow control, by fairness id and priority.",
            labels=labels,
        )
        for (band, flow), (count, nbytes) in sorted(self._sizes().items()):
            size.add_metric([flow, str(band)], count)
            held.add_metric([flow, str(band)], nbytes)
        yield size
        yield held
