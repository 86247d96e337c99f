"""``epp serve``: the ext_proc gRPC server, gRPC health, and the HTTP admin port.

Three steps: the flags become :class:`~epp.serving.wiring.ServeOptions` and a validated
config (:func:`run`); :func:`epp.serving.wiring.build` wires every part into an
:class:`~epp.serving.lifecycle.App` without starting anything;
:func:`epp.serving.lifecycle.run` starts the parts in order, waits for SIGINT/SIGTERM
and stops them in reverse order."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from dataclasses import replace
from pathlib import Path

from epp import config
from epp.common import argtypes
from epp.common.extensions import ExtensionError
from epp.common.params import ConfigError
from epp.datalayer import peers as peer_flags
from epp.disagg.coordinators import COORDINATORS
from epp.discovery import file_source, serve_pool, static
from epp.extproc import tlsflags
from epp.extproc.stall import CHUNK_TIMEOUT_S
from epp.extproc.transport import DEFAULT_TRANSPORT, TRANSPORTS
from epp.llmd import routerflags
from epp.observability.logsetup import add_log_level
from epp.scheduling.scheduler import ProfileScheduler
from epp.serving import leaderelection, lifecycle, membershipflags
from epp.serving.reload import DEFAULT_POLL_S, ConfigFile
from epp.serving.wiring import DEFAULT_MAX_BODY_BYTES, ServeOptions, build
from epp.workers import options as worker_options
from epp.workers.replica import tag_logs

log = logging.getLogger("epp.serving.serve")

DEFAULT_LISTEN_HOST = "127.0.0.1"
LISTEN_HOST_ENV = "EPP_LISTEN_HOST"  # the image sets it to 0.0.0.0
DEFAULT_HEALTH_PORT = 9003


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
        "--access-log",
        action="store_true",
        help="log one line per routing decision (request id, model, endpoints, prefill "
        "endpoint, P/D decision, predicted time to first token, flow, time in scheduling) "
        "to the logger epp.access, whatever --log-level; also on at --log-level debug "
        "(docs/operations.md#access-log)",
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
        access_log=args.access_log or logging.getLogger().isEnabledFor(logging.DEBUG),
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
        if log.isEnabledFor(logging.INFO):  # rendered only to be shown (YAML: start-up cost)
            log.info("effective config (%s):\n%s", cfg.source, config.effective_yaml(cfg).rstrip())
    else:
        tag_logs(opts.workers.index)
    await lifecycle.run(build(opts, cfg, scheduler, config_file))
