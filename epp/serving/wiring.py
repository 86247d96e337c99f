"""What an ``epp serve`` process is made of: :func:`build` wires every part of it into an
:class:`~epp.serving.lifecycle.App`, starting nothing, by the process's role (one process
serving alone, the parent of ``--workers``, one of its workers), from the
:class:`ServeOptions` its flags give (:mod:`epp.serving.serve`)."""

from __future__ import annotations

import logging
import random
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import web

from epp import config
from epp.admin.auth import API_KEY_ENV, ApiKeyAuth
from epp.admin.http import make_admin_app
from epp.admin.instances import add_status_routes
from epp.admin.metricsauth import KubeReviewer, MetricsAuth
from epp.common.health import HealthBoard, ReadinessGate
from epp.common.params import ConfigError
from epp.datalayer.ejection import Ejector
from epp.datalayer.engines import engine_names
from epp.datalayer.kvevents import kv_event_subscribers
from epp.datalayer.orca import ORCA_FORMAT_HEADER
from epp.datalayer.peers import PeerLoad, PeerOptions
from epp.datalayer.scraper import MetricsScraper, ScrapePace
from epp.datalayer.settings import DataLayerConfig
from epp.datastore import Datastore
from epp.disagg.coordinators import COORDINATORS, CoordinatorEnv
from epp.disagg.legs import AiohttpLegTransport, LegClient
from epp.discovery import file_source
from epp.discovery.names import NameResolver
from epp.discovery.poolref import PoolRef, SelectorRef
from epp.discovery.readiness import ReadinessProbe
from epp.extproc.stall import CHUNK_TIMEOUT_S
from epp.extproc.transport import DEFAULT_TRANSPORT, make_transport
from epp.flowcontrol.controller import FlowController
from epp.flowcontrol.saturation import WatchedObjectives
from epp.lifecycle.bus import Hooks
from epp.lifecycle.observers import EjectionFeedback, PlacementFeedback, builtin_observers
from epp.lifecycle.observers.accesslog import ACCESS_LOGGER, AccessLog
from epp.lifecycle.observers.tracing import Tracing
from epp.lifecycle.picking import Picking
from epp.lifecycle.resolving import ModelResolver
from epp.lora.admin import add_lora_routes
from epp.lora.placement import AdapterPlacement
from epp.observability.metrics import EppMetrics
from epp.observability.tracing import Tracer
from epp.router import EndpointOutcomes, Router, StreamOptions
from epp.scheduling.plugins.prefix import PrefixCacheScorer
from epp.scheduling.scheduler import ProfileScheduler
from epp.serving.leaderelection import LeaderElection, LeaderOptions
from epp.serving.lifecycle import App, Component, Step
from epp.serving.listeners import GrpcPorts, HttpPort, Listeners
from epp.serving.membershipflags import MembershipOptions
from epp.serving.reload import DEFAULT_POLL_S, ConfigFile, ConfigReloader
from epp.serving.sources import DISCOVERY_SOURCES, DiscoveryContext, DiscoveryKind
from epp.types import Endpoint
from epp.workers.options import WorkerOptions
from epp.workers.replica import SharedSync, WorkerLink
from epp.xds.eds import EdsServer, EnvoySync

if TYPE_CHECKING:
    from epp.extproc.certreload import LiveCertificate
    from epp.extproc.tls import ServerTls
    from epp.workers.group import WorkerGroup

# the `epp serve` command's log lines (the banner, tracing), under its name as before
log = logging.getLogger("epp.serving.serve")

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class ServeOptions:
    listen_host: str = "127.0.0.1"
    grpc_port: int = 9002
    http_port: int = 9090
    health_port: int | None = None  # a plaintext gRPC health port of its own (None: none)
    endpoints: tuple[Endpoint, ...] = ()
    endpoints_file: Path | None = None  # --endpoints-file: followed as it changes
    endpoints_file_poll_s: float = file_source.DEFAULT_POLL_S
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    stream_chunk_timeout_s: float = CHUNK_TIMEOUT_S
    ready_file: Path | None = None
    transport: str = DEFAULT_TRANSPORT
    shutdown_grace_s: float = 10.0
    config_path: Path | None = None
    config_text: str | None = None  # --config-text: instead of a file, never reloaded
    config_poll_s: float = DEFAULT_POLL_S  # 0: reload on SIGHUP only
    membership: MembershipOptions = field(default_factory=MembershipOptions)
    pool: PoolRef | None = None  # follow this InferencePool's pods (Kubernetes)
    selector: SelectorRef | None = None  # or the pods this selector matches
    tls: ServerTls | None = None  # None: plaintext gRPC port
    http_tls: ServerTls | None = None  # None: plaintext HTTP port (`is tls`: the same one)
    tls_reload_s: float = 2.0  # how often certificate files are checked (0: never)
    metrics_auth: bool = False  # --metrics-endpoint-auth: /metrics for allowed identities
    kubeconfig: Path | None = None  # for it (discovery has its own in pool/selector)
    tracing: bool = False  # --tracing: OpenTelemetry spans over OTLP (docs/tracing.md)
    access_log: bool = False  # --access-log (or --log-level debug): a line per decision
    workers: WorkerOptions = field(default_factory=WorkerOptions)
    argv: tuple[str, ...] = ()  # the command line, which the parent of --workers reuses
    leader: LeaderOptions | None = None  # --ha-enable-leader-election: ready only leading
    peers: PeerOptions = field(default_factory=PeerOptions)  # --peer-load-*: shared counts


def build(
    opts: ServeOptions,
    cfg: config.EppConfig,
    scheduler: ProfileScheduler,
    config_file: ConfigFile | None = None,
    *,
    discovery: Mapping[str, DiscoveryKind] = DISCOVERY_SOURCES,
) -> App:
    """Wire every part of the EPP, starting nothing: no port opens, no task starts (call
    it inside the event loop: some parts bind to it). ``config_file``: where ``cfg``
    came from, reloaded on SIGHUP and when it changes (None: the built-in default, never
    reloaded). ``discovery``: the source kinds to ask. Raises ExtensionError if an
    installed part the config names cannot load, ConfigError if the coordinator cannot
    defer its decode pick as ``deferDecode`` asks.

    The process's role picks the wiring: one process serving alone (:class:`_Single`),
    the parent of ``--workers`` (:class:`_Parent`) or one of its workers
    (:class:`_Worker`)."""
    role: type[_Process]
    if opts.workers.link is not None:
        role = _Worker
    elif opts.workers.parent:
        role = _Parent
    else:
        role = _Single
    return role(opts, cfg, scheduler, config_file, discovery).app()


class _Process(ABC):
    """The parts every process role wires, in the order they need each other; nothing
    starts. A role (a subclass) adds its own parts in :meth:`_role_parts`, and says
    which parts run, in which order (:meth:`app`)."""

    serves_requests = True  # False: the parent of --workers (its workers serve them)
    guards_metrics = True  # False: a worker, whose /metrics only its parent reads
    discovers = True  # asks the discovery source kinds

    def __init__(
        self,
        opts: ServeOptions,
        cfg: config.EppConfig,
        scheduler: ProfileScheduler,
        config_file: ConfigFile | None,
        discovery: Mapping[str, DiscoveryKind],
    ) -> None:
        self.opts, self.cfg, self.scheduler = opts, cfg, scheduler
        dl = cfg.data_layer
        for engine in {dl.engine, *(e.engine for e in cfg.endpoints)}:
            engine_names(engine)  # an installed dialect that cannot load fails now
        self.datastore = datastore = Datastore(drain_timeout_s=opts.membership.drain_timeout_s)
        self.names = NameResolver(datastore, interval_s=opts.membership.resolve_interval_s)
        self.metrics = metrics = EppMetrics(
            datastore, pool_name=opts.pool.name if opts.pool else "default"
        )
        metrics.report_latency_model(scheduler.latency)  # a reload keeps this model
        # InferenceObjectives' priorities, kept by Kubernetes discovery, or in a worker by
        # its parent (a reload keeps it)
        self.objectives = WatchedObjectives()
        scheduler.objectives = self.objectives
        pd = cfg.disaggregation
        self.legs = LegClient(AiohttpLegTransport(pd.connect_timeout_s, pd.prefill_timeout_s))
        self.probe = ReadinessProbe(model=opts.membership.model)
        self.ejector = Ejector(datastore, opts.membership.ejection, self.probe.check)
        self.envoy_sync: EnvoySync = EnvoySync()
        self.outcomes: EndpointOutcomes = self.ejector
        self._role_parts()
        self.router = self._router(random.Random())
        self.reloader = ConfigReloader(
            config_file or ConfigFile(None),
            cfg,
            scheduler,
            self.router,
            metrics.config_reloads,
            poll_s=opts.config_poll_s,
            on_sighup=self._on_sighup,
        )
        metrics.report_prefix_indexes(
            lambda: {
                n: p.index
                for n, p in self.reloader.scheduler.plugins.items()
                if isinstance(p, PrefixCacheScorer)
            }
        )
        self.eds = EdsServer(datastore, sync=self.envoy_sync)
        self.transport = make_transport(opts.transport, self.router, self.eds)
        self.health = HealthBoard(self.transport)
        self.readiness = ReadinessGate(self.health)
        self.reviewer = (
            KubeReviewer(opts.kubeconfig) if opts.metrics_auth and self.guards_metrics else None
        )
        self.admin = make_admin_app(
            datastore,
            metrics,
            ready=self.health.serving,
            metrics_auth=MetricsAuth(self.reviewer) if self.reviewer is not None else None,
            exposition=self._exposition(),
        )
        self._admin_routes(self.admin)
        self.before, self.after = _sources(
            discovery if self.discovers else {}, self._discovery_context()
        )
        self.certificates: tuple[LiveCertificate | None, LiveCertificate | None] = (None, None)
        self.tls_reload: list[Component] = []
        if opts.tls is not None or opts.http_tls is not None:  # (imports cryptography)
            from epp.extproc.certreload import CertReloader, live_pair

            self.certificates = live_pair(opts.tls, opts.http_tls)
            certs = CertReloader(self.certificates, opts.tls_reload_s)
            self.tls_reload.append(Step("tls-reload", certs.start, certs.stop))
        self.leader: list[Component] = []
        if opts.leader is not None:
            self.leader.append(LeaderElection(opts.leader, self.readiness.hold("leader-election")))

    @abstractmethod
    def app(self) -> App:
        """The role's parts, in start order."""

    def _role_parts(self) -> None:
        """A role's own parts, wired before the request path (which reports to them):
        none but the defaults (Envoy told directly, outcomes judged by the ejector)."""
        return None

    def _on_sighup(self) -> None:
        """Besides reloading the config file: nothing, but in the parent of --workers."""
        return None

    def _exposition(self) -> Callable[[bytes], Awaitable[bytes]] | None:
        """What /metrics adds to this process's own page (None: nothing)."""
        return None

    def _router(self, rng: random.Random) -> Router:
        """The request path, and the parts it reports to that run beside it (kept here:
        the P/D coordinator, LoRA placement, flow control, the tracer)."""
        opts, cfg, datastore, metrics = self.opts, self.cfg, self.datastore, self.metrics
        outcomes = self.outcomes
        request_headers = []
        if cfg.data_layer.orca.header_format is not None:
            request_headers.append((ORCA_FORMAT_HEADER, cfg.data_layer.orca.header_format))
        pd = cfg.disaggregation
        self.coordinator = coordinator = COORDINATORS[pd.coordinator](
            CoordinatorEnv(
                datastore,
                metrics,
                self.legs,
                rng,
                pd.bootstrap_port,
                outcomes.success,
                lambda address, reason, serving: outcomes.failure(address, reason, serving=serving),
                prefill_budget_s=pd.prefill_timeout_s,
                defer_decode=pd.defer_decode,
            )
        )
        if pd.defer_decode and not getattr(coordinator, "defers", False):
            raise ConfigError(
                f"disaggregation.deferDecode: the {pd.coordinator} coordinator picks the decode "
                "endpoint with the prefill endpoint (nixl and kv-pool can defer it; "
                "docs/disaggregation.md#deferred-decode-selection)"
            )
        self.placement = placement = AdapterPlacement(
            cfg.lora_placement, lambda: router.models.adapters, datastore, metrics
        )
        self.flow = flow = FlowController(cfg.flow_control, metrics)
        self.tracer = tracer = _tracer(opts) if self.serves_requests else None
        # what learns from each request: the one place observers are registered
        observers = [
            *builtin_observers(metrics, datastore, self.scheduler.latency, flow),
            EjectionFeedback(outcomes, datastore, time.monotonic),
            PlacementFeedback(placement),
        ]
        if opts.access_log:
            logging.getLogger(ACCESS_LOGGER).setLevel(logging.INFO)  # whatever --log-level
            observers.append(AccessLog())
        if tracer is not None:
            observers.append(Tracing(tracer, coordinator.name))
        picking = Picking(
            datastore,
            self.scheduler,
            Hooks(observers),
            rng=rng,
            defers=bool(getattr(coordinator, "defers", False)),
        )
        router = Router(
            picking,
            flow,
            metrics,
            resolver=ModelResolver(cfg.models, placement, rng),
            coordinator=coordinator,
            stream=StreamOptions(
                max_body_bytes=opts.max_body_bytes,
                request_headers=tuple(request_headers),
                stream_chunk_timeout_s=opts.stream_chunk_timeout_s,
                echo_served_endpoint=cfg.conformance.echo_served_endpoint,
                envoy_sync=self.envoy_sync,
            ),
        )
        return router

    def _admin_routes(self, admin: web.Application) -> None:
        add_status_routes(
            admin, self.datastore, self.ejector.state, self.scheduler.latency, self.flow.status
        )
        add_lora_routes(
            admin,
            self.placement,
            self.datastore,
            lambda: self.router.models.adapters,
            ApiKeyAuth(self.opts.membership.admin_api_key),
        )

    def _discovery_context(self) -> DiscoveryContext:
        opts, engine = self.opts, self.cfg.data_layer.engine
        return DiscoveryContext(
            self.datastore,
            self.names,
            self.readiness,
            self.admin,
            self.probe.check,
            engine=engine,
            # flags name no engine: the config's applies
            endpoints=(*self.cfg.endpoints, *(replace(e, engine=engine) for e in opts.endpoints)),
            endpoints_file=opts.endpoints_file,
            endpoints_file_poll_s=opts.endpoints_file_poll_s,
            pool=opts.pool,
            selector=opts.selector,
            membership=opts.membership,
            objectives=self.objectives,
        )

    def _grpc_ports(self, health_port: int | None) -> GrpcPorts:
        opts = self.opts
        return GrpcPorts(
            self.transport,
            opts.listen_host,
            opts.grpc_port,
            health_port=health_port,
            tls=self.certificates[0],
            grace_s=opts.shutdown_grace_s,
        )

    def _listeners(
        self, grpc: GrpcPorts | None, http: HttpPort, on_listening: Callable[[int, int], None]
    ) -> Listeners:
        return Listeners(grpc, http, self.health, self.eds, on_listening)

    def _banner(self, group: WorkerGroup | None) -> Callable[[int, int], None]:
        return _announce(self.opts, self.cfg.disaggregation.coordinator, self.datastore, group)

    def _public_http(self) -> HttpPort:
        """The HTTP port the flags name, TLS when asked."""
        opts = self.opts
        return HttpPort(self.admin, opts.listen_host, opts.http_port, self.certificates[1])

    # the parts every role runs, started in this order and stopped in the reverse one:
    # first these, then the role's data sources, then _ready(), its ports, then _last()
    def _first(self) -> list[Component]:
        tracer, reviewer = self.tracer, self.reviewer
        return [
            # stopped last: the spans of the last requests are exported
            *([Step("tracing", on_stop=tracer.close)] if tracer is not None else []),
            Step("legs", on_stop=self.legs.close),
            *([Step("metrics-auth", on_stop=reviewer.close)] if reviewer is not None else []),
            Step("coordinator", on_stop=self.coordinator.close),
            Step("readiness-probe", on_stop=self.probe.stop),
            Step("lora-placement", self.placement.start, self.placement.stop),
            Step("ejector", self.ejector.start, self.ejector.stop),
            Step("names", self.names.start, self.names.stop),
        ]

    def _data_layer(self) -> list[Component]:
        return _data_layer(self.datastore, self.metrics, self.cfg.data_layer, self.ejector)

    def _own_load(self) -> list[Component]:
        """KV events (each serving process subscribes itself) and the peers' in-flight
        counts (stopped after the ports close: the peers hear this process's last
        requests end)."""
        return [
            *_kv_events(self.datastore, self.metrics, self.scheduler),
            *_peer_load(self.datastore, self.metrics, self.opts.peers),
        ]

    def _ready(self) -> list[Component]:
        return [_GcWatch(self.metrics), Step("readiness", self.readiness.publish), *self.before]

    def _last(self) -> list[Component]:
        return [
            # stopped before the ports close: the lease is released at once
            *self.leader,
            # stopped before the ports close: held requests are answered 503 at once
            Step("flow-control", on_stop=self.flow.close),
            *self.after,
            Step("config-reload", self.reloader.start, self.reloader.stop),
            *self.tls_reload,
        ]


def _silent(grpc_port: int, http_port: int) -> None:
    """A worker says nothing once it listens: its parent announces the group."""


def _ports_info(listeners: Listeners) -> Callable[[], dict[str, object]]:
    return lambda: {
        "grpc_port": listeners.grpc_port,
        "grpc_ports": [listeners.grpc_port],
        "http_port": listeners.http_port,
        "grpc_health_port": listeners.health_port,
    }


class _Single(_Process):
    """One process serving alone: it scrapes, serves requests and announces itself."""

    def app(self) -> App:
        opts = self.opts
        listeners = self._listeners(
            self._grpc_ports(opts.health_port), self._public_http(), self._banner(None)
        )
        components = [
            *self._first(),
            *self._data_layer(),
            *self._own_load(),
            *self._ready(),
            listeners,
            *self._last(),
        ]
        return App(components, opts.ready_file, _ports_info(listeners))


class _Parent(_Process):
    """The parent of ``--workers``: it holds the pool (discovery, scrapes, ejection) and
    feeds its workers, which hold the gRPC ports and serve the requests; its HTTP port
    answers for the group."""

    serves_requests = False
    group: WorkerGroup

    def _role_parts(self) -> None:
        from epp.workers.group import WorkerGroup  # only this role's: start-up cost

        opts = self.opts
        self.group = WorkerGroup(
            self.datastore,
            self.ejector,
            opts.workers,
            opts.grpc_port,
            opts.argv,
            opts.shutdown_grace_s,
            objectives=self.objectives,
        )

    def _on_sighup(self) -> None:
        self.group.hang_up()

    def _exposition(self) -> Callable[[bytes], Awaitable[bytes]] | None:
        return self.group.exposition

    def _admin_routes(self, admin: web.Application) -> None:
        admin.middlewares.append(self.group.flush_middleware)
        self.group.add_routes(admin)
        super()._admin_routes(admin)

    def app(self) -> App:
        opts, group = self.opts, self.group
        # the workers hold the gRPC ports
        listeners = self._listeners(None, self._public_http(), self._banner(group))
        components = [
            *self._first(),
            *self._data_layer(),
            *self._ready(),
            group,
            listeners,
            *self._last(),
        ]
        info = group.ready_info
        return App(components, opts.ready_file, lambda: info(listeners.http_port))


class _Worker(_Process):
    """A worker of ``--workers``: its endpoints, their load and its request outcomes
    go through its link to the parent; it serves requests on its own gRPC port and says
    nothing (its parent announces the group)."""

    guards_metrics = False
    discovers = False  # its endpoints come from its parent
    link: WorkerLink

    def _role_parts(self) -> None:
        workers = self.opts.workers
        assert workers.link is not None
        self.envoy_sync = SharedSync()
        self.link = WorkerLink(
            self.datastore, workers.link, workers.index, self.envoy_sync, self.objectives
        )
        # its request outcomes are judged by its parent's ejector
        self.outcomes = self.link

    def app(self) -> App:
        opts, link = self.opts, self.link
        listeners = self._listeners(
            # worker 0 answers on the health port, the other workers do not
            self._grpc_ports(opts.health_port if opts.workers.index == 0 else None),
            # it serves only its parent (/metrics), plaintext on loopback
            HttpPort(self.admin, "127.0.0.1", opts.http_port),
            _silent,
        )
        components = [
            *self._first(),
            *self._own_load(),
            *self._ready(),
            # opened before its ports (it knows the pool first)
            Step("worker-link", link.start, link.stop),
            listeners,
            # it tells its parent its ports once they listen
            Step("worker-ready", lambda: link.ready(*listeners.ports)),
            *self._last(),
        ]
        # its parent learns its ports over the link
        return App(components, None, _ports_info(listeners))


def _tracer(opts: ServeOptions) -> Tracer | None:
    """OpenTelemetry with --tracing, imported only then (docs/tracing.md)."""
    if not opts.tracing:
        return None
    try:
        from epp.observability.otel import OtelTracer
    except ImportError as exc:  # e.g. xds-protos' old copy of opentelemetry.proto
        raise OSError(
            f"--tracing: OpenTelemetry cannot load ({exc}); reinstall it with `pip install "
            "--force-reinstall --no-deps opentelemetry-proto` (docs/tracing.md)"
        ) from None

    log.info("tracing: OpenTelemetry spans exported over OTLP/HTTP (OTEL_* variables)")
    return OtelTracer()


def _sources(
    kinds: Mapping[str, DiscoveryKind], ctx: DiscoveryContext
) -> tuple[list[Component], list[Component]]:
    """The sources the flags and config call for: those started before the ports open,
    and those started once they listen."""
    before: list[Component] = []
    after: list[Component] = []
    for kind in kinds.values():
        source = kind.create(ctx)
        if source is not None:
            (after if kind.after_listening else before).append(source)
    return before, after


def _announce(
    opts: ServeOptions, coordinator: str, datastore: Datastore, group: WorkerGroup | None
) -> Callable[[int, int], None]:
    """What to log once the ports listen (the banner ``make run`` shows)."""

    def listening(grpc_port: int, http_port: int) -> None:
        ports = group.grpc_ports if group is not None else [grpc_port]
        log.info(
            "serving ext_proc (%s, %s) on %s:%s, HTTP (%s) on %s:%d, coordinator %s, "
            "%d endpoint(s): %s",
            opts.transport,
            "plaintext" if opts.tls is None else f"TLS: {opts.tls.source}",
            opts.listen_host,
            ",".join(map(str, ports)) + (f" ({len(ports)} workers)" if group is not None else ""),
            "plaintext" if opts.http_tls is None else f"TLS: {opts.http_tls.source}",
            opts.listen_host,
            http_port,
            coordinator,
            len(datastore),
            ", ".join(
                f"{s.address} ({s.endpoint.role.value})" for s in datastore.snapshot().endpoints
            )
            or "none",
        )
        if opts.membership.admin_api_key is None:
            log.info(
                "admin API: /instances/add and /remove are disabled (set %s or "
                "--admin-api-key-file to enable them)",
                API_KEY_ENV,
            )

    return listening


class _GcWatch:
    """Times every GC pass into ``epp_gc_pause_seconds`` while started."""

    def __init__(self, metrics: EppMetrics) -> None:
        self._metrics = metrics
        self._stop: Callable[[], None] | None = None

    async def start(self) -> None:
        self._stop = self._metrics.watch_gc()

    async def stop(self) -> None:
        if self._stop is not None:
            self._stop()


def _kv_events(
    datastore: Datastore, metrics: EppMetrics, scheduler: ProfileScheduler
) -> list[Component]:
    """A KV-event subscriber set per plugin that reads events (precise prefix scorers);
    a reload cannot add or change such a plugin (epp.serving.reload), so these stay right."""
    subscribers = kv_event_subscribers(datastore, metrics.registry, scheduler.plugins)
    return [Step(f"kv-events:{name}", s.start, s.stop) for name, s in subscribers.items()]


def _peer_load(datastore: Datastore, metrics: EppMetrics, opts: PeerOptions) -> list[Component]:
    """In-flight counts shared with the peers the flags name (docs/replicas.md)."""
    if not opts.enabled:
        return []
    peers = PeerLoad(datastore, opts)
    peers.register(metrics.registry)
    return [peers]


def _data_layer(
    datastore: Datastore, metrics: EppMetrics, dl: DataLayerConfig, ejector: Ejector
) -> list[Component]:
    """The scrapers and ORCA streams the config asks for."""
    parts: list[Component] = []
    if dl.scrape_metrics:
        scraper = MetricsScraper(
            datastore,
            metrics,
            ScrapePace(
                interval_s=dl.scrape_interval_s,
                max_per_s=dl.max_scrapes_per_s,
                stale_after_s=dl.stale_after_s,
                timeout_s=dl.scrape_timeout_s,
            ),
            on_unreachable=ejector.failure,
            on_success=lambda address: ejector.success(address, serving=False),
        )
        parts.append(Step("scraper", scraper.start, scraper.stop))
    if dl.orca.oob_port is not None:
        # imported here: grpcio, which no other part of a default `epp serve` needs
        from epp.datalayer.orca_oob import OrcaStreams

        port = dl.orca.oob_port
        streams = OrcaStreams(
            datastore,
            metrics,
            port_for=lambda _endpoint: port,
            report_interval_s=dl.orca.report_interval_s,
        )
        parts.append(Step("orca-streams", streams.start, streams.stop))
    return parts
