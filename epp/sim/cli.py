"""``epp sim``: run one simulated vLLM server until SIGTERM / SIGINT (then exit 0).

The socket is bound before anything else (``--port 0`` picks a free port), so the
instance id defaults to the real ``host:port`` and the ready file names the real port.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import socket
from collections.abc import Callable

from aiohttp import web

from epp import argtypes
from epp.cli import add_log_level
from epp.readyfile import write_ready
from epp.sim.config import KvConnector, SimConfig, address
from epp.sim.kv_routes import make_bootstrap_app
from epp.sim.orca import OrcaServer
from epp.sim.server import SIM_SERVER, make_app
from epp.types import Role

log = logging.getLogger("epp.sim")

# After SIGTERM, in-flight requests get this long to finish, then as long again to
# unwind once cancelled (aiohttp applies the timeout to both phases).
SHUTDOWN_GRACE_S = 0.5


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``epp sim`` (process-level settings only; all have defaults)."""
    d = SimConfig()
    add = parser.add_argument
    add("--host", default=d.host, help="address to listen on")
    add(
        "--port", type=argtypes.port, default=d.port, help="port to listen on (0 = pick a free one)"
    )
    add(
        "--ready-file",
        default=None,
        metavar="PATH",
        help="write {host, port, url, instance[, orca_port][, bootstrap_port]} here once bound",
    )
    add("--model", default=d.model, help="the served model name")
    add("--instance-id", default=None, help="name in x-sim-instance (default: host:port)")
    add(
        "--max-num-seqs",
        type=argtypes.positive_int,
        default=d.max_num_seqs,
        help="sequences running at once; the rest wait FIFO",
    )
    add(
        "--kv-blocks", type=argtypes.positive_int, default=d.kv_blocks, help="KV capacity in blocks"
    )
    add(
        "--block-size", type=argtypes.positive_int, default=d.block_size, help="tokens per KV block"
    )
    add(
        "--prefill-overhead-ms",
        type=argtypes.non_negative_float,
        default=d.prefill_overhead_ms,
        help="fixed prefill cost per request",
    )
    add(
        "--prefill-ms-per-token",
        type=argtypes.non_negative_float,
        default=d.prefill_ms_per_token,
        help="prefill cost per uncached prompt token",
    )
    add(
        "--decode-ms-per-token",
        type=argtypes.non_negative_float,
        default=d.decode_ms_per_token,
        help="base inter-token latency",
    )
    add(
        "--itl-ms-per-running-seq",
        type=argtypes.non_negative_float,
        default=d.itl_ms_per_running_seq,
        help="inter-token latency added per running sequence",
    )
    add(
        "--default-max-tokens",
        type=argtypes.positive_int,
        default=d.default_max_tokens,
        help="tokens generated when the request sets no max_tokens",
    )
    add(
        "--time-scale",
        type=argtypes.non_negative_float,
        default=d.time_scale,
        help="multiplies every simulated latency (0 = answer instantly)",
    )
    # ORCA load reports (epp.sim.orca)
    add(
        "--orca-format",
        type=str.lower,
        choices=["none", "text", "json", "bin"],
        default=d.orca_format,
        help="add an endpoint-load-metrics header in this format to every non-streaming "
        "response (a request's endpoint-load-metrics-format header overrides it)",
    )
    add(
        "--orca-port",
        type=argtypes.port,
        default=None,
        metavar="PORT",
        help="serve ORCA OpenRcaService/StreamCoreMetrics (gRPC) on this port "
        "(0 = pick a free one; not given = off)",
    )
    _add_disaggregation_arguments(parser, d)
    add_log_level(parser)


def _role(text: str) -> Role:
    try:
        return Role.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_disaggregation_arguments(parser: argparse.ArgumentParser, d: SimConfig) -> None:
    group = parser.add_argument_group(
        "prefill/decode disaggregation", "how this instance takes part in a P/D split"
    )
    add = group.add_argument
    add(
        "--role",
        type=_role,
        default=d.role,
        metavar="{prefill,decode,prefill-decode}",
        help="the instance's P/D role ('both' = prefill-decode); it decides which side of "
        "an sglang/mooncake rendezvous it takes and whether it writes or reads a KV pool",
    )
    add(
        "--kv-connector",
        type=str.lower,
        choices=[c.value for c in KvConnector],
        default=d.kv_connector.value,
        help="how KV moves between instances: nixl (vLLM: the decode pulls the blocks named "
        "in kv_transfer_params), sglang or mooncake (bootstrap rendezvous, both legs at "
        "once), pool (a KV pool shared through --kv-pool-dir)",
    )
    add(
        "--kv-hold-seconds",
        type=argtypes.non_negative_float,
        default=d.kv_hold_seconds,
        help="nixl: how long a prefill keeps its blocks for a decode to pull (wall time)",
    )
    add(
        "--kv-transfer-ms-per-token",
        type=argtypes.non_negative_float,
        default=d.kv_transfer_ms_per_token,
        help="decode cost per prompt token whose KV is received instead of computed",
    )
    add(
        "--bootstrap-timeout-seconds",
        type=argtypes.non_negative_float,
        default=d.bootstrap_timeout_seconds,
        help="sglang/mooncake: how long either side waits in a bootstrap room; nixl: the "
        "pull's timeout (wall time)",
    )
    add(
        "--bootstrap-port",
        type=argtypes.port,
        default=None,
        metavar="PORT",
        help="sglang/mooncake prefill: also serve the rendezvous on this port (0 = pick a "
        "free one; default: the HTTP port only)",
    )
    add(
        "--kv-pool-dir",
        default=None,
        metavar="DIR",
        help="pool: the directory every instance of the deployment shares as its KV pool "
        "(created on first write; required with --kv-connector pool)",
    )


def config_from_args(args: argparse.Namespace, port: int) -> SimConfig:
    """The SimConfig for parsed flags, given the port actually bound."""
    return SimConfig(
        model=args.model,
        instance_id=args.instance_id or address(args.host, port),
        host=args.host,
        port=port,
        max_num_seqs=args.max_num_seqs,
        kv_blocks=args.kv_blocks,
        block_size=args.block_size,
        prefill_overhead_ms=args.prefill_overhead_ms,
        prefill_ms_per_token=args.prefill_ms_per_token,
        decode_ms_per_token=args.decode_ms_per_token,
        itl_ms_per_running_seq=args.itl_ms_per_running_seq,
        default_max_tokens=args.default_max_tokens,
        time_scale=args.time_scale,
        orca_format=args.orca_format,
        role=args.role,
        kv_connector=KvConnector(args.kv_connector),
        kv_hold_seconds=args.kv_hold_seconds,
        bootstrap_timeout_seconds=args.bootstrap_timeout_seconds,
        kv_transfer_ms_per_token=args.kv_transfer_ms_per_token,
        kv_pool_dir=args.kv_pool_dir,
        bootstrap_port=args.bootstrap_port,
    )


def _bind(host: str, port: int) -> socket.socket:
    family, kind, proto, _, sockaddr = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(sockaddr)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


async def _start_site(runner: web.AppRunner, host: str, port: int) -> int:
    """Serve ``runner`` on host:port; the port actually bound."""
    sock = _bind(host, port)
    await web.SockSite(runner, sock).start()
    bound: int = sock.getsockname()[1]
    return bound


async def _serve(args: argparse.Namespace) -> int:
    try:
        sock = _bind(args.host, args.port)
    except OSError as exc:
        log.error("cannot listen on %s: %s", address(args.host, args.port), exc)
        return 1
    try:
        config = config_from_args(args, sock.getsockname()[1])
    except ValueError as exc:
        sock.close()
        log.error("invalid simulator settings: %s", exc)
        return 2
    # Access logs cost more than a simulated request at benchmark rates: debug only.
    access_log = logging.getLogger("aiohttp.access") if args.log_level == "debug" else None
    runner = web.AppRunner(
        make_app(config),
        handler_cancellation=True,
        access_log=access_log,
        shutdown_timeout=SHUTDOWN_GRACE_S,
    )
    await runner.setup()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    orca_server: OrcaServer | None = None
    bootstrap_runner: web.AppRunner | None = None
    try:
        await web.SockSite(runner, sock).start()
        url = f"http://{address(config.host, config.port)}"
        ready: dict[str, object] = {
            "host": config.host,
            "port": config.port,
            "url": url,
            "instance": config.instance_id,
        }
        if args.orca_port is not None:  # out-of-band ORCA (epp.sim.orca)
            orca_server = OrcaServer(runner.app[SIM_SERVER].engine)
            try:
                ready["orca_port"] = await orca_server.start(config.host, args.orca_port)
            except OSError as exc:
                log.error("%s", exc)
                return 1
        if config.bootstrap_port is not None:  # the rendezvous on a port of its own
            bootstrap_runner = web.AppRunner(
                make_bootstrap_app(runner.app[SIM_SERVER].handoff),
                handler_cancellation=True,
                access_log=access_log,
                shutdown_timeout=SHUTDOWN_GRACE_S,
            )
            await bootstrap_runner.setup()
            try:
                ready["bootstrap_port"] = await _start_site(
                    bootstrap_runner, config.host, config.bootstrap_port
                )
            except OSError as exc:
                log.error("cannot serve the bootstrap rendezvous: %s", exc)
                return 1
        write_ready(args.ready_file, ready)
        log.info("simulating %r as %s on %s: %s", config.model, config.instance_id, url, config)
        await stop.wait()
        log.info("stopping %s", config.instance_id)
    finally:
        if orca_server is not None:
            await orca_server.stop()
        if bootstrap_runner is not None:
            await bootstrap_runner.cleanup()
        await runner.cleanup()
    return 0


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:  # optional: the simulator is correct on the stdlib loop too
        return None
    return uvloop.new_event_loop


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM or SIGINT; 0 on a clean stop, 1 if the port cannot be bound."""
    try:
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            return runner.run(_serve(args))
    except KeyboardInterrupt:  # Ctrl-C before the signal handlers were installed
        return 0
