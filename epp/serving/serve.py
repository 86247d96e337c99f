"""``epp serve``: the ext_proc gRPC server, gRPC health, and the HTTP admin port.

Three steps: the flags become :class:`ServeOptions` and a validated config
(:func:`run`); :func:`build` wires every part into an :class:`~epp.serving.lifecycle.App`
without starting anything; :func:`epp.serving.lifecycle.run` starts the parts in order, waits
for SIGINT/SIGTERM and stops them in reverse order."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import random
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from epp import config
from epp.admin.auth import API_KEY_ENV, ApiKeyAuth
from epp.admin.http import make_admin_app
from epp.admin.instances import add_status_routes
from epp.admin.lora import add_lora_routes
from epp.admin.metricsauth import KubeReviewer, MetricsAuth
from epp.common import argtypes
from epp.common.extensions import ExtensionError
from epp.common.health import HealthBoard, ReadinessGate
from epp.datalayer import peers as peer_flags
from epp.datalayer.ejection import Ejector
from epp.datalayer.engines import engine_names
from epp.datalayer.kvevents import kv_event_subscribers
from epp.datalayer.orca import ORCA_FORMAT_HEADER
from epp.datalayer.orca_oob import OrcaStreams
from epp.datalayer.peers import PeerLoad, PeerOptions
from epp.datalayer.scraper import MetricsScraper
from epp.datalayer.settings import DataLayerConfig
from epp.datastore import Datastore
from epp.disagg.coordinators import COORDINATORS, CoordinatorEnv
from epp.disagg.legs import AiohttpLegTransport, LegClient
from epp.discovery import file_source, serve_pool, static
from epp.discovery.names import NameResolver
from epp.discovery.poolref import PoolRef, SelectorRef
from epp.discovery.readiness import ReadinessProbe
from epp.extproc import tlsflags
from epp.extproc.stall import CHUNK_TIMEOUT_S
from epp.extproc.transport import DEFAULT_TRANSPORT, TRANSPORTS, make_transport
from epp.flowcontrol.controller import FlowController
from epp.llmd import routerflags
from epp.lora.placement import AdapterPlacement
from epp.observability.logsetup import add_log_level
from epp.observability.metrics import EppMetrics
from epp.observability.tracing import Tracer
from epp.router import EndpointOutcomes, Router
from epp.scheduling.params import ConfigError
from epp.scheduling.plugins.prefix import PrefixCacheScorer
from epp.scheduling.saturation import WatchedObjectives
from epp.scheduling.scheduler import ProfileScheduler
from epp.serving import leaderelection, lifecycle, membershipflags
from epp.serving.leaderelection import LeaderElection, LeaderOptions
from epp.serving.lifecycle import App, Component, Step
from epp.serving.listeners import Listeners
from epp.serving.membershipflags import MembershipOptions
from epp.serving.reload import DEFAULT_POLL_S, ConfigFile, ConfigReloader
from epp.serving.sources import DISCOVERY_SOURCES, DiscoveryContext, DiscoveryKind
from epp.types import Endpoint
from epp.workers import options as worker_options
from epp.workers.group import WorkerGroup
from epp.workers.options import WorkerOptions
from epp.workers.replica import SharedSync, WorkerLink, tag_logs
from epp.xds.eds import EdsServer, EnvoySync

if TYPE_CHECKING:
    from epp.extproc.certreload import LiveCertificate
    from epp.extproc.tls import ServerTls

log = logging.getLogger("epp.serving.serve")

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
DEFAULT_LISTEN_HOST = "127.0.0.1"
LISTEN_HOST_ENV = "EPP_LISTEN_HOST"  # the image sets it to 0.0.0.0
DEFAULT_HEALTH_PORT = 9003


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
    workers: WorkerOptions = field(default_factory=WorkerOptions)
    argv: tuple[str, ...] = ()  # the command line, which the parent of --workers reuses
    leader: LeaderOptions | None = None  # --ha-enable-leader-election: ready only leading
    peers: PeerOptions = field(default_factory=PeerOptions)  # --peer-load-*: shared counts


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--listen-host",
        help=f"address the gRPC and HTTP ports bind to (default ${LISTEN_HOST_ENV}, else "
        f"{DEFAULT_LISTEN_HOST}; the image sets {LISTEN_HOST_ENV}=0.0.0.0)",
    )
    parser.add_argument(
        "--grpc-port",
        type=argtypes.port,
        default=9002,
        help="ext_proc gRPC port (0 = any free port)",
    )
    parser.add_argument(
        "--http-port",
        "--metrics-port",
        type=argtypes.port,
        default=9090,
        help="HTTP port for /metrics, /health, /ready and the admin API "
        "(--metrics-port: the llm-d Router's name for it)",
    )
    parser.add_argument(
        "--grpc-health-port",
        type=argtypes.port,
        default=DEFAULT_HEALTH_PORT,
        help="plaintext gRPC health port of its own (kubelet's gRPC probes; the services "
        "answered: docs/operations.md); 0 = any free port",
    )
    static.add_arguments(parser)
    file_source.add_arguments(parser)
    parser.add_argument(
        "--coordinator",
        choices=sorted(COORDINATORS),
        help="how prefill and decode legs meet; overrides the config's "
        "disaggregation.coordinator (default nixl)",
    )
    parser.add_argument(
        "--max-body-bytes",
        type=argtypes.positive_int,
        default=DEFAULT_MAX_BODY_BYTES,
        help="largest request body accepted; larger ones get 413",
    )
    parser.add_argument(
        "--stream-chunk-timeout",
        type=argtypes.non_negative_float,
        default=CHUNK_TIMEOUT_S,
        metavar="SECONDS",
        help="a streamed response whose server sends nothing this long after its first "
        "byte is ended with an SSE error event, where the response body passes the EPP "
        "(--processing full); 0: never (docs/timeouts.md)",
    )
    parser.add_argument(
        "--config",
        "--config-file",
        type=Path,
        metavar="FILE",
        help="scheduling/data-layer config (YAML, see `epp config show`); default: built in. "
        "Reloaded on SIGHUP and when it changes (see docs/configuration.md)",
    )
    parser.add_argument(
        "--config-text",
        metavar="YAML",
        help="the config as text instead of a file (never reloaded)",
    )
    parser.add_argument(
        "--config-poll-seconds",
        type=argtypes.non_negative_float,
        default=DEFAULT_POLL_S,
        help="how often to check the --config file for changes (0: reload on SIGHUP only)",
    )
    parser.add_argument(
        "--ready-file", type=Path, help="write {grpc_port, http_port} as JSON here once serving"
    )
    parser.add_argument(
        "--transport",
        choices=sorted(TRANSPORTS),
        default=DEFAULT_TRANSPORT,
        help="gRPC server carrying ext_proc streams: grpclib, grpcio, or native (this "
        "project's own HTTP/2 framing; new, not measured yet); docs/operations.md",
    )
    parser.add_argument(
        "--shutdown-grace-seconds",
        type=argtypes.non_negative_float,
        default=10.0,
        help="on SIGTERM, how long open requests may take to finish before they are cut",
    )
    worker_options.add_arguments(parser)
    peer_flags.add_arguments(parser)
    tlsflags.add_arguments(parser)
    parser.add_argument("--no-uvloop", action="store_true", help="use asyncio's default event loop")
    membershipflags.add_arguments(parser)
    serve_pool.add_arguments(parser)
    add_log_level(parser)
    routerflags.add_arguments(parser)
    leaderelection.add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    opts = ServeOptions(
        listen_host=args.listen_host or os.environ.get(LISTEN_HOST_ENV) or DEFAULT_LISTEN_HOST,
        grpc_port=args.grpc_port,
        http_port=args.http_port,
        health_port=args.grpc_health_port,
        endpoints_file=args.endpoints_file,
        endpoints_file_poll_s=args.endpoints_file_poll_seconds,
        max_body_bytes=args.max_body_bytes,
        stream_chunk_timeout_s=args.stream_chunk_timeout,
        ready_file=args.ready_file,
        transport=args.transport,
        shutdown_grace_s=args.shutdown_grace_seconds,
        config_path=args.config,
        config_text=args.config_text,
        config_poll_s=args.config_poll_seconds,
        metrics_auth=args.metrics_endpoint_auth,
        kubeconfig=args.kubeconfig,
        tracing=args.tracing,
        tls_reload_s=args.tls_reload_seconds,
        workers=worker_options.from_args(args),
        argv=tuple(sys.argv[1:]),
    )
    try:
        opts = replace(opts, membership=membershipflags.options(args))
    except (OSError, ValueError) as exc:
        log.error("admin API key: %s", exc)
        return 2
    try:
        opts = replace(opts, endpoints=tuple(static.endpoints(args)))
        opts = replace(opts, pool=serve_pool.pool_ref(args))
        opts = replace(opts, selector=serve_pool.selector_ref(args))
        opts = replace(opts, leader=leaderelection.options(args))
        opts = replace(opts, peers=peer_flags.from_args(args))
        if opts.peers.enabled and opts.workers.parent:
            # the workers share theirs among themselves (docs/workers.md)
            raise ValueError(
                "--peer-load-bind/--peer-load-peers and --workers > 1 exclude each other"
            )
        tlsflags.check_flags(args)
        opts.workers.check(
            opts.grpc_port, {"--grpc-health-port": opts.health_port, "--http-port": opts.http_port}
        )
        if args.config is not None and args.config_text is not None:
            raise ValueError("--config (--config-file) and --config-text exclude each other")
        if opts.leader is not None and opts.workers.count > 1:
            # each worker would contend for the lease (in Kubernetes, scale with replicas)
            raise ValueError("--ha-enable-leader-election and --workers > 1 exclude each other")
    except ValueError as exc:
        log.error("%s", exc)
        return 2

    def with_flags(cfg: config.EppConfig) -> config.EppConfig:
        if not args.coordinator:
            return cfg
        return replace(
            cfg, disaggregation=replace(cfg.disaggregation, coordinator=args.coordinator)
        )

    config_file = ConfigFile(opts.config_path, with_flags, text=opts.config_text)
    try:
        cfg = config_file.load()
        scheduler = config.instantiate(cfg, config.builtin_registry())
    except ConfigError as exc:
        log.error("invalid config: %s", exc)
        return 2
    try:
        opts = replace(opts, tls=tlsflags.from_args(args))
        opts = replace(opts, http_tls=tlsflags.http_from_args(args, opts.tls))
    except ValueError as exc:  # TlsError: the file and what is wrong with it
        log.error("cannot start: %s", exc)
        return 1
    if not args.no_uvloop:
        try:
            import uvloop

            uvloop.install()
        except ImportError:
            log.info("uvloop not installed; using asyncio's default loop")
    try:
        asyncio.run(_serve(opts, cfg, scheduler, config_file))
    except ExtensionError as exc:  # an installed coordinator, source or engine
        log.error("%s", exc)
        return 2
    except ConfigError as exc:  # a coordinator that cannot do what the config asks
        log.error("invalid config: %s", exc)
        return 2
    except OSError as exc:
        log.error("cannot start: %s", exc)
        return 1
    return 0


async def _serve(
    opts: ServeOptions,
    cfg: config.EppConfig,
    scheduler: ProfileScheduler,
    config_file: ConfigFile,
) -> None:
    if opts.workers.link is None:  # a worker's parent has said it
        log.info("effective config (%s):\n%s", cfg.source, config.effective_yaml(cfg).rstrip())
    else:
        tag_logs(opts.workers.index)
    await lifecycle.run(build(opts, cfg, scheduler, config_file))


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
    defer its decode pick as ``deferDecode`` asks."""
    dl = cfg.data_layer
    for engine in {dl.engine, *(e.engine for e in cfg.endpoints)}:
        engine_names(engine)  # an installed dialect that cannot load fails now
    datastore = Datastore(drain_timeout_s=opts.membership.drain_timeout_s)
    names = NameResolver(datastore, interval_s=opts.membership.resolve_interval_s)
    metrics = EppMetrics(datastore, pool_name=opts.pool.name if opts.pool else "default")
    metrics.report_latency_model(scheduler.latency)  # a reload keeps this model
    # InferenceObjectives' priorities, kept by Kubernetes discovery, or in a worker by
    # its parent (a reload keeps it)
    objectives = WatchedObjectives()
    scheduler.objectives = objectives
    request_headers = []
    if dl.orca.header_format is not None:
        request_headers.append((ORCA_FORMAT_HEADER, dl.orca.header_format))
    pd = cfg.disaggregation
    legs = LegClient(AiohttpLegTransport(pd.connect_timeout_s, pd.prefill_timeout_s))
    rng = random.Random()
    probe = ReadinessProbe(model=opts.membership.model)
    ejector = Ejector(datastore, opts.membership.ejection, probe.check)
    workers = opts.workers
    envoy_sync: EnvoySync = EnvoySync()
    link: WorkerLink | None = None
    if workers.link is not None:  # a worker: its endpoints come from its parent
        envoy_sync = SharedSync()
        link = WorkerLink(datastore, workers.link, workers.index, envoy_sync, objectives)
        discovery = {}
    # a worker's request outcomes are judged by its parent's ejector
    outcomes: EndpointOutcomes = link if link is not None else ejector
    group = (
        WorkerGroup(
            datastore,
            ejector,
            workers,
            opts.grpc_port,
            opts.argv,
            opts.shutdown_grace_s,
            objectives=objectives,
        )
        if workers.parent
        else None
    )
    coordinator = COORDINATORS[pd.coordinator](
        CoordinatorEnv(
            datastore,
            metrics,
            legs,
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
    placement = AdapterPlacement(
        cfg.lora_placement, lambda: router.models.adapters, datastore, metrics
    )
    flow = FlowController(cfg.flow_control, metrics)
    tracer = _tracer(opts) if group is None else None  # the parent serves no requests
    router = Router(
        datastore,
        scheduler,
        metrics,
        max_body_bytes=opts.max_body_bytes,
        rng=rng,
        request_headers=request_headers,
        coordinator=coordinator,
        outcomes=outcomes,
        envoy_sync=envoy_sync,
        models=cfg.models,
        placement=placement,
        flow=flow,
        tracer=tracer,
        stream_chunk_timeout_s=opts.stream_chunk_timeout_s,
        echo_served_endpoint=cfg.conformance.echo_served_endpoint,
    )
    reloader = ConfigReloader(
        config_file or ConfigFile(None),
        cfg,
        scheduler,
        router,
        metrics.config_reloads,
        poll_s=opts.config_poll_s,
        on_sighup=group.hang_up if group is not None else lambda: None,
    )
    metrics.report_prefix_indexes(
        lambda: {
            n: p.index
            for n, p in reloader.scheduler.plugins.items()
            if isinstance(p, PrefixCacheScorer)
        }
    )
    eds = EdsServer(datastore, sync=envoy_sync)
    transport = make_transport(opts.transport, router, eds)
    health = HealthBoard(transport)
    readiness = ReadinessGate(health)
    # a worker's /metrics is read by its parent only (on 127.0.0.1), which does the auth
    reviewer = KubeReviewer(opts.kubeconfig) if opts.metrics_auth and link is None else None
    metrics_auth = MetricsAuth(reviewer) if reviewer is not None else None
    admin = make_admin_app(
        datastore,
        metrics,
        ready=health.serving,
        metrics_auth=metrics_auth,
        exposition=group.exposition if group is not None else None,
    )
    if group is not None:
        admin.middlewares.append(group.flush_middleware)
        group.add_routes(admin)
    add_status_routes(admin, datastore, ejector.state, scheduler.latency, flow.status)
    add_lora_routes(
        admin,
        placement,
        datastore,
        lambda: router.models.adapters,
        ApiKeyAuth(opts.membership.admin_api_key),
    )
    ctx = DiscoveryContext(
        datastore,
        names,
        readiness,
        admin,
        probe.check,
        engine=dl.engine,
        # flags name no engine: the config's applies
        endpoints=(*cfg.endpoints, *(replace(e, engine=dl.engine) for e in opts.endpoints)),
        endpoints_file=opts.endpoints_file,
        endpoints_file_poll_s=opts.endpoints_file_poll_s,
        pool=opts.pool,
        selector=opts.selector,
        membership=opts.membership,
        objectives=objectives,
    )
    before, after = _sources(discovery, ctx)
    certificates: tuple[LiveCertificate | None, LiveCertificate | None] = (None, None)
    tls_reload: list[Component] = []
    if opts.tls is not None or opts.http_tls is not None:  # (imports cryptography)
        from epp.extproc.certreload import CertReloader, live_pair

        certificates = live_pair(opts.tls, opts.http_tls)
        certs = CertReloader(certificates, opts.tls_reload_s)
        tls_reload.append(Step("tls-reload", certs.start, certs.stop))
    leader: list[Component] = []
    if opts.leader is not None:
        leader.append(LeaderElection(opts.leader, readiness.hold("leader-election")))
    listeners = Listeners(
        transport,
        eds,
        health,
        admin,
        host=opts.listen_host,
        grpc_port=opts.grpc_port,
        http_port=opts.http_port,
        # worker 0 answers on the health port, the parent and other workers do not
        health_port=opts.health_port if group is None and workers.index == 0 else None,
        tls=certificates[0],
        # a worker's HTTP port serves only its parent, plaintext on loopback
        http_tls=certificates[1] if link is None else None,
        grace_s=opts.shutdown_grace_s,
        # a worker says nothing: its parent announces the group
        on_listening=(lambda _g, _h: None)
        if link
        else _announce(opts, pd.coordinator, datastore, group),
        grpc=group is None,
        # a worker's HTTP port only serves its parent (/metrics)
        http_host="127.0.0.1" if link is not None else None,
    )
    # started in this order, stopped in the reverse one
    components: list[Component] = [
        # stopped last: the spans of the last requests are exported
        *([Step("tracing", on_stop=tracer.close)] if tracer is not None else []),
        Step("legs", on_stop=legs.close),
        *([Step("metrics-auth", on_stop=reviewer.close)] if reviewer is not None else []),
        Step("coordinator", on_stop=coordinator.close),
        Step("readiness-probe", on_stop=probe.stop),
        Step("lora-placement", placement.start, placement.stop),
        Step("ejector", ejector.start, ejector.stop),
        Step("names", names.start, names.stop),
        # the parent scrapes for its workers; each worker subscribes to KV events itself
        *(_data_layer(datastore, metrics, dl, ejector) if link is None else []),
        *(_kv_events(datastore, metrics, scheduler) if group is None else []),
        # stopped after the ports close: the peers hear this process's last requests end
        *(_peer_load(datastore, metrics, opts.peers) if group is None else []),
        _GcWatch(metrics),
        Step("readiness", readiness.publish),
        *before,
        *_worker_link(link),
        *([group] if group is not None else []),
        listeners,
        *_worker_ready(link, listeners),
        # stopped before the ports close: the lease is released at once
        *leader,
        # stopped before the ports close: held requests are answered 503 at once
        Step("flow-control", on_stop=flow.close),
        *after,
        Step("config-reload", reloader.start, reloader.stop),
        *tls_reload,
    ]
    if group is not None:
        info = group.ready_info
        return App(components, opts.ready_file, lambda: info(listeners.http_port))
    return App(
        components,
        # a worker's parent learns its ports over the link
        ready_file=opts.ready_file if link is None else None,
        ready_info=lambda: {
            "grpc_port": listeners.grpc_port,
            "grpc_ports": [listeners.grpc_port],
            "http_port": listeners.http_port,
            "grpc_health_port": listeners.health_port,
        },
    )


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


def _worker_link(link: WorkerLink | None) -> list[Component]:
    """A worker's link to its parent, opened before its ports (it knows the pool first)."""
    return [] if link is None else [Step("worker-link", link.start, link.stop)]


def _worker_ready(link: WorkerLink | None, listeners: Listeners) -> list[Component]:
    """A worker tells its parent its ports once they listen."""
    if link is None:
        return []
    return [Step("worker-ready", lambda: link.ready(*listeners.ports))]


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
            interval_s=dl.scrape_interval_s,
            max_per_s=dl.max_scrapes_per_s,
            stale_after_s=dl.stale_after_s,
            timeout_s=dl.scrape_timeout_s,
            on_unreachable=ejector.failure,
            on_success=lambda address: ejector.success(address, serving=False),
        )
        parts.append(Step("scraper", scraper.start, scraper.stop))
    if dl.orca.oob_port is not None:
        port = dl.orca.oob_port
        streams = OrcaStreams(
            datastore,
            metrics,
            port_for=lambda _endpoint: port,
            report_interval_s=dl.orca.report_interval_s,
        )
        parts.append(Step("orca-streams", streams.start, streams.stop))
    return parts
