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
from pathlib import Path

from aiohttp import web

from epp.common.readyfile import write_ready
from epp_harness.sim import chunk_tokenizer, tokenizer
from epp_harness.sim.config import address
from epp_harness.sim.flags import add_arguments, config_from_args
from epp_harness.sim.kv_routes import make_bootstrap_app
from epp_harness.sim.orca import OrcaServer
from epp_harness.sim.server import SIM_SERVER, make_app

# the subcommand contract of epp.cli
__all__ = ["add_arguments", "run"]

log = logging.getLogger("epp.sim")  # the `epp sim` command's name in log lines

# After SIGTERM, in-flight requests get this long to finish, then as long again to
# unwind once cancelled (aiohttp applies the timeout to both phases).
SHUTDOWN_GRACE_S = 0.5


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


async def _runner(app: web.Application, access_log: logging.Logger | None) -> web.AppRunner:
    """A set-up runner: a client that disconnects while its request waits or prefills
    frees its place at once (handler cancellation)."""
    runner = web.AppRunner(
        app,
        handler_cancellation=True,
        access_log=access_log,
        shutdown_timeout=SHUTDOWN_GRACE_S,
    )
    await runner.setup()
    return runner


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
    runner = await _runner(make_app(config), access_log)
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
        if args.orca_port is not None:  # out-of-band ORCA (epp_harness.sim.orca)
            orca_server = OrcaServer(runner.app[SIM_SERVER].engine)
            try:
                ready["orca_port"] = await orca_server.start(config.host, args.orca_port)
            except OSError as exc:
                log.error("%s", exc)
                return 1
        if config.bootstrap_port is not None:  # the rendezvous on a port of its own
            bootstrap_app = make_bootstrap_app(runner.app[SIM_SERVER].handoff)
            bootstrap_runner = await _runner(bootstrap_app, access_log)
            try:
                ready["bootstrap_port"] = await _start_site(
                    bootstrap_runner, config.host, config.bootstrap_port
                )
            except OSError as exc:
                log.error("cannot serve the bootstrap rendezvous: %s", exc)
                return 1
        publisher = runner.app[SIM_SERVER].kv_events
        if publisher is not None:  # vLLM's --kv-events-config, the publisher binding
            try:
                events_port, replay_port = await publisher.start(
                    config.host, args.kv_events_port, args.kv_events_replay_port
                )
            except Exception as exc:  # zmq.ZMQError: the port is taken
                log.error("cannot publish KV events: %s", exc)
                return 1
            ready["kv_events_port"] = events_port
            if replay_port is not None:
                ready["kv_events_replay_port"] = replay_port
        if args.write_tokenizer:  # the tokenizer this instance counts with
            writer = chunk_tokenizer if publisher is None else tokenizer
            writer.write_tokenizer_files(Path(args.write_tokenizer))
        write_ready(args.ready_file, ready)
        log.info("simulating %r as %s on %s: %s", config.model, config.instance_id, url, config)
        await stop.wait()
        log.info("stopping %s", config.instance_id)
    finally:
        publisher = runner.app[SIM_SERVER].kv_events
        if publisher is not None:
            await publisher.stop()
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
