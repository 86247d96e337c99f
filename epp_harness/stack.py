"""``epp stack``: Envoy + EPP + simulated model servers on loopback (what ``make run`` runs).

:class:`LocalStack` is also what the end-to-end tests and benchmarks start, so the
stack a user runs is the stack that is tested.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import FrameType
from typing import Any, Self

import yaml

from epp import config
from epp.common import argtypes
from epp.common.extensions import ExtensionError
from epp.common.params import ConfigError
from epp.extproc.stall import CHUNK_TIMEOUT_S
from epp.extproc.transport import DEFAULT_TRANSPORT, TRANSPORTS
from epp.observability.logsetup import add_log_level, level_of
from epp_harness.envoyconfig import (
    CLUSTER_KINDS,
    PROCESSING_MODES,
    ClusterKind,
    EnvoyOptions,
    Processing,
    baseline_config,
    client_routed_config,
    epp_config,
)
from epp_harness.envoyproc import EnvoyProcess, write_config
from epp_harness.procs import ManagedProcess, ProcessFailed, scratch_dir, spawn_epp
from epp_harness.supervisor import Supervisor

HOST = "127.0.0.1"

# Every simulator the stack starts reports usage.prompt_tokens_details.cached_tokens (off
# by default in `epp sim`, as in vLLM): the EPP learns prefill cost from
# prompt_tokens - cached_tokens, so the stack runs its servers as one would deploy vLLM
# for it (--enable-prompt-tokens-details).
SIM_BASE_ARGS = ("--enable-prompt-tokens-details",)

# The simulators' KV connector that matches each coordinator (epp sim --kv-connector).
SIM_CONNECTOR = {"nixl": "nixl", "sidecar": "nixl", "concurrent": "sglang", "kv-pool": "pool"}

SUPERVISE_EVERY_S = 0.1  # how often `epp stack` looks at its children


class StackDown(ProcessFailed):
    """Envoy exited: the stack cannot serve without its listener."""


@dataclass
class StackOptions:
    servers: int = 4  # plain servers (prefill and decode in one)
    prefill: int = 0  # P/D split: prefill-only servers ...
    decode: int = 0  # ... and decode-only servers
    coordinator: str = "nixl"  # how their legs meet (epp serve --coordinator)
    model: str = "sim-model"
    envoy_port: int = 8081
    envoy_admin_port: int = 9901
    grpc_port: int = 9002
    http_port: int = 9090
    processing: Processing = "full"
    cluster: ClusterKind = "eds"
    sim_args: list[str] = field(default_factory=list)
    # more `epp sim` args for some plain servers: the i-th list goes to sim-i (e.g. a
    # LoRA adapter preloaded on a few of them)
    sim_args_each: list[list[str]] = field(default_factory=list)
    epp_args: list[str] = field(default_factory=list)
    log_level: str = "info"
    workdir: Path | None = None
    # False: Envoy alone (the benchmarks' baselines): round robin over the simulators, or
    # with cluster "original-dst" to whatever address the client's
    # x-gateway-destination-endpoint header names
    epp: bool = True
    # False: the EPP is not given the simulators as flags (--endpoint etc.); something else
    # registers them (e.g. a test's fake Kubernetes API with pods on those ports)
    static_endpoints: bool = True
    envoy_concurrency: int | None = None
    # the EPP serves its gRPC port with a self-signed certificate; Envoy talks TLS to it
    epp_tls: bool = False
    # Envoy fails open: with the EPP unreachable, requests go round robin to the
    # servers that can decode (EnvoyOptions.failure_mode_allow, fallback_servers)
    fail_open: bool = False
    # per-attempt silence allowed from a model server (docs/timeouts.md)
    first_byte_timeout_s: float = EnvoyOptions.first_byte_timeout_s
    stream_idle_timeout_s: float = EnvoyOptions.stream_idle_timeout_s
    # the EPP's: a stream silent this long after its first byte is ended (full processing)
    stream_chunk_timeout_s: float = CHUNK_TIMEOUT_S
    # the simulators publish KV events (docs/kv-events.md); the EPP gets them as config
    # endpoints labelled with their publishers, and its precise scorers the simulators'
    # tokenizer (see kv_events_config)
    kv_events: bool = False
    message_timeout_s: float = EnvoyOptions.message_timeout_s  # ext_proc's (tests)
    epp_env: dict[str, str] = field(default_factory=dict)  # added to the EPP's environment
    # rewrites each `epp serve` argv (command first) before it starts: the scenario tests
    # run another checkout's EPP, whose CLI may lack a flag (tests/scenarios/eppfrom.py)
    adapt_serve: Callable[[list[str]], list[str]] | None = None
    # EPP worker processes (epp serve --workers), each listed in Envoy's ext_proc cluster
    workers: int = 1
    # `epp serve` processes side by side (active-active replicas, docs/replicas.md): the
    # first on grpc_port/http_port, the others on free ports, every one an endpoint of
    # Envoy's ext_proc cluster; each follows the same servers (and their KV events)
    replicas: int = 1


class LocalStack:
    def __init__(self, opts: StackOptions) -> None:
        self.opts = opts
        self.workdir = opts.workdir or scratch_dir("epp-stack-")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.sims: list[ManagedProcess] = []
        self.sidecars: list[ManagedProcess] = []
        self.epp: ManagedProcess | None = None
        self.more_epps: list[ManagedProcess] = []  # replicas beyond the first
        self._peer_dir: Path | None = None  # the replicas' peer-load sockets
        self.epp_ports: list[tuple[int, int]] = []  # every replica's (gRPC, HTTP) port
        self.envoy: EnvoyProcess | None = None
        self.sim_addresses: list[str] = []
        self.sim_urls: list[str] = []
        # what the EPP routes to, as `epp serve` flags: --endpoint/--prefill/--decode ADDR
        self.endpoint_args: list[str] = []
        self.grpc_port = 0
        self.grpc_ports: list[int] = []  # every worker's, grpc_port first
        self.http_port = 0
        self._supervisor = Supervisor()

    @property
    def envoy_url(self) -> str:
        assert self.envoy is not None
        return f"http://{HOST}:{self.envoy.port}"

    @property
    def epp_http_url(self) -> str:
        return f"http://{HOST}:{self.http_port}"

    def start(self) -> Self:
        """Start everything or, if any part fails, stop what started and raise."""
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        o = self.opts
        ports = {"--envoy-port": o.envoy_port, "--envoy-admin-port": o.envoy_admin_port}
        if o.epp:
            ports.update({"--grpc-port": o.grpc_port, "--http-port": o.http_port})
        check_ports_free(ports)
        plan = self._plan()
        for name, _flag, extra in plan:
            self.sims.append(self.start_sim(name, *extra))
        for sim in self.sims:
            info = sim.wait_ready()
            self._supervisor.add(sim, _port_pins, time.monotonic())
            self.sim_addresses.append(f"{info['host']}:{info['port']}")
            self.sim_urls.append(info["url"])
        self._start_sidecars(plan)
        envoy_opts = EnvoyOptions(
            listen_port=o.envoy_port,
            admin_port=o.envoy_admin_port,
            processing=o.processing,
            cluster=o.cluster,
            epp_tls=o.epp_tls,
            failure_mode_allow=o.fail_open,
            fallback_servers=tuple(
                (str(p.info["host"]), int(p.info["port"]))
                for p in self.sims
                if not p.name.startswith("prefill")
            )
            if o.fail_open
            else (),
            first_byte_timeout_s=o.first_byte_timeout_s,
            stream_idle_timeout_s=o.stream_idle_timeout_s,
            message_timeout_s=o.message_timeout_s,
        )
        if not o.epp:
            servers = [(str(i["host"]), int(i["port"])) for i in (p.info for p in self.sims)]
            config = (
                client_routed_config(envoy_opts)
                if o.cluster == "original-dst"
                else baseline_config(envoy_opts, servers)
            )
            path = write_config(config, self.workdir / "envoy.yaml")
            self.envoy = EnvoyProcess(path, self.workdir, concurrency=o.envoy_concurrency).start()
            return
        epp_args, endpoint_args = list(o.epp_args), self.endpoint_args
        if o.kv_events:
            published = [int(sim.info["kv_events_port"]) for sim in self.sims]
            epp_args = kv_events_config(
                epp_args, endpoint_args, published, self.tokenizer_dir, self.workdir
            )
            endpoint_args = []
        serve_args = [
            "--grpc-health-port",
            "0",
            "--log-level",
            o.log_level,
            "--coordinator",
            o.coordinator,
            "--stream-chunk-timeout",
            f"{o.stream_chunk_timeout_s:g}",
            *(endpoint_args if o.static_endpoints else []),
            *(["--tls-self-signed"] if o.epp_tls else []),
            # further workers on free ports: Envoy's config lists whichever they got
            *(["--workers", str(o.workers), "--worker-base-port", "0"] if o.workers > 1 else []),
            *epp_args,
        ]
        replica_ports = [(o.grpc_port, o.http_port)] + [(0, 0)] * (o.replicas - 1)
        argvs = [
            ["serve", "--grpc-port", str(grpc), "--http-port", str(http), *serve_args,
             *self._peer_load_args(i)]
            for i, (grpc, http) in enumerate(replica_ports)
        ]  # fmt: skip
        procs = [
            spawn_epp(
                self.workdir,
                "epp" if i == 0 else f"epp-{i}",
                *(o.adapt_serve(argv) if o.adapt_serve else argv),
                env=o.epp_env,
            )
            for i, argv in enumerate(argvs)
        ]
        self.epp, self.more_epps = procs[0], procs[1:]
        for proc in procs:
            info = proc.wait_ready()
            self._supervisor.add(proc, _replica_pins, time.monotonic())
            self.epp_ports.append((info["grpc_port"], info["http_port"]))
            self.grpc_ports.extend(info["grpc_ports"])  # each replica's workers
        self.grpc_port, self.http_port = self.epp_ports[0]
        more = tuple((HOST, port) for port in self.grpc_ports[1:])
        config = epp_config(replace(envoy_opts, epp_port=self.grpc_port, more_epps=more))
        path = write_config(config, self.workdir / "envoy.yaml")
        self.envoy = EnvoyProcess(path, self.workdir, concurrency=o.envoy_concurrency).start()

    def _peer_load_args(self, index: int) -> list[str]:
        """Replica ``index`` shares its in-flight counts with the other replicas (unix
        sockets in a directory of their own; docs/replicas.md). Replicas with workers share
        only among their own workers (`epp serve` refuses both)."""
        o = self.opts
        if o.replicas < 2 or o.workers > 1:
            return []
        if self._peer_dir is None:  # short: a unix socket's path has at most 107 bytes
            self._peer_dir = Path(tempfile.mkdtemp(prefix="epp-peers-"))
        sockets = [f"ipc://{self._peer_dir}/load-{i}" for i in range(o.replicas)]
        others = [s for i, s in enumerate(sockets) if i != index]
        return ["--peer-load-bind", sockets[index], "--peer-load-peers", ",".join(others)]

    def _plan(self) -> list[tuple[str, str, list[str]]]:
        """(name, `epp serve` flag, extra `epp sim` args) for every simulator."""
        o = self.opts
        connector = ["--kv-connector", SIM_CONNECTOR[o.coordinator]]
        if o.coordinator == "kv-pool":
            connector += ["--kv-pool-dir", str(self.workdir / "kv-pool")]
        each = o.sim_args_each
        plan: list[tuple[str, str, list[str]]] = [
            (f"sim-{i}", "--endpoint", list(each[i]) if i < len(each) else [])
            for i in range(o.servers)
        ]
        plan += [
            (f"prefill-{i}", "--prefill", ["--role", "prefill", *connector])
            for i in range(o.prefill)
        ]
        plan += [
            (f"decode-{i}", "--decode", ["--role", "decode", *connector]) for i in range(o.decode)
        ]
        if o.kv_events:
            plan = [(name, flag, [*extra, "--kv-events-port", "0"]) for name, flag, extra in plan]
            name, flag, extra = plan[0]
            plan[0] = (name, flag, [*extra, "--write-tokenizer", str(self.tokenizer_dir)])
        return plan

    @property
    def tokenizer_dir(self) -> Path:
        """Where the first simulator writes its tokenizer (``kv_events`` only)."""
        return self.workdir / "tokenizer"

    def _start_sidecars(self, plan: list[tuple[str, str, list[str]]]) -> None:
        """Register every simulator with the EPP; with the sidecar coordinator a decode
        server is reached through its own `epp sidecar`."""
        o = self.opts
        for (name, flag, _), address in zip(plan, self.sim_addresses, strict=True):
            if flag == "--decode" and o.coordinator == "sidecar":
                sidecar = spawn_epp(
                    self.workdir, f"sidecar-{name}", "sidecar", "--port", "0",
                    "--decode", address, "--log-level", o.log_level,
                )  # fmt: skip
                self.sidecars.append(sidecar)
                info = sidecar.wait_ready()
                self._supervisor.add(sidecar, _port_pins, time.monotonic())
                address = f"{info['host']}:{info['port']}"
            self.endpoint_args += [flag, address]

    def start_sim(self, name: str, *extra: str) -> ManagedProcess:
        """Start one more simulator (not yet known to the EPP); call wait_ready() on it."""
        o = self.opts
        return spawn_epp(
            self.workdir, name, "sim", "--port", "0", "--model", o.model,
            "--log-level", o.log_level, *SIM_BASE_ARGS, *o.sim_args, *extra,
        )  # fmt: skip

    def retire_sim(self, sim: ManagedProcess) -> None:
        """Stop simulator ``sim`` for good (it is not started again); whoever told the
        EPP about it tells the EPP it is gone."""
        self._supervisor.remove(sim)
        sim.stop()

    def supervise(self, now: float | None = None) -> list[str]:
        """Restart simulators, sidecars and EPP replicas (with their workers) that
        exited, each on its own ports again, with backoff; returns what happened, for
        the log. Raises StackDown when Envoy exited: it is not restarted (its listener
        is what clients hold on to)."""
        if self.envoy is not None and not self.envoy.process.alive():
            raise StackDown("envoy exited; stopping the stack")
        return self._supervisor.check(time.monotonic() if now is None else now)

    def stop(self) -> None:
        """Stop in reverse order: Envoy first so no new traffic arrives."""
        if self.envoy is not None:
            self.envoy.stop()
        # each tier told at once, then waited for: they wind down side by side
        epps = [*self.more_epps, *([self.epp] if self.epp is not None else [])]
        for epp in epps:
            epp.terminate()
        for epp in epps:
            epp.stop()
        if self._peer_dir is not None:
            shutil.rmtree(self._peer_dir, ignore_errors=True)
        servers = [*self.sidecars, *self.sims]
        for proc in servers:
            proc.terminate()
        for proc in servers:
            proc.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()


ROLE_OF_FLAG = {"--endpoint": "decode", "--decode": "decode", "--prefill": "prefill"}


def kv_events_config(
    epp_args: list[str],
    endpoint_args: list[str],
    kv_ports: list[int],
    tokenizer: Path,
    workdir: Path,
) -> list[str]:
    """``epp_args`` with its ``--config FILE`` (none: the built-in default) replaced by a
    copy that lists the simulators as ``endpoints`` (``endpoint_args``: flag, address
    pairs in the simulators' order), each labelled ``epp.dev/kv-events`` with its
    publisher, and gives every ``precise-prefix-cache-scorer`` without a ``tokenizer``
    the simulators' one. Flags carry no labels, hence the file."""
    args = list(epp_args)
    doc: dict[str, Any] = {}
    if "--config" in args:
        at = args.index("--config")
        path = Path(args[at + 1])
        del args[at : at + 2]
        loaded = yaml.safe_load(path.read_text())
        doc = dict(loaded) if isinstance(loaded, dict) else {}
        if doc.get("endpoints"):
            raise ProcessFailed(f"{path}: the stack lists the simulators; give no endpoints")
    for plugin in doc.get("plugins") or []:
        if isinstance(plugin, dict) and plugin.get("type") == "precise-prefix-cache-scorer":
            params = plugin.setdefault("parameters", {}) or {}
            params.setdefault("tokenizer", str(tokenizer))
            plugin["parameters"] = params
    pairs = list(zip(endpoint_args[::2], endpoint_args[1::2], strict=True))
    doc["endpoints"] = [
        {
            "address": address,
            "role": ROLE_OF_FLAG[flag],
            "labels": {"epp.dev/kv-events": f"{HOST}:{port}"},
        }
        for (flag, address), port in zip(pairs, kv_ports, strict=True)
    ]
    out = workdir / "epp-config.yaml"
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    return [*args, "--config", str(out)]


def _port_pins(info: Mapping[str, Any]) -> dict[str, str]:
    """A simulator or sidecar comes back on its port (the EPP knows it by address), a
    simulator that publishes KV events on its publisher's ports too (the EPP subscribed
    there)."""
    pins = {"--port": str(info["port"])}
    for flag, key in (("--kv-events-port", "kv_events_port"),
                      ("--kv-events-replay-port", "kv_events_replay_port")):  # fmt: skip
        if info.get(key):
            pins[flag] = str(info[key])
    return pins


def _replica_pins(info: Mapping[str, Any]) -> dict[str, str]:
    """An EPP replica comes back on its ports: its gRPC port and its workers' are in
    Envoy's ext_proc cluster, its HTTP port in the banner."""
    pins = {"--grpc-port": str(info["grpc_port"]), "--http-port": str(info["http_port"])}
    if info.get("grpc_health_port"):
        pins["--grpc-health-port"] = str(info["grpc_health_port"])
    if len(info["grpc_ports"]) > 1:
        pins["--worker-ports"] = ",".join(map(str, info["grpc_ports"][1:]))
    return pins


def check_ports_free(ports: dict[str, int]) -> None:
    """Fail fast, naming the flag, if a fixed port is already taken."""
    for flag, port in ports.items():
        if port == 0:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((HOST, port))
            except OSError:
                raise ProcessFailed(
                    f"port {port} ({flag}) is already in use on {HOST}: stop whatever holds it "
                    f"or pick another port with {flag}"
                ) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--prefill",
        type=argtypes.non_negative_int,
        help="simulated prefill servers (default 2, or 0 when --servers is given)",
    )
    parser.add_argument(
        "--decode",
        type=argtypes.non_negative_int,
        help="simulated decode servers (default 2, or 0 when --servers is given)",
    )
    parser.add_argument(
        "--servers",
        type=argtypes.non_negative_int,
        default=0,
        help="simulated servers that do prefill and decode in one (no P/D split)",
    )
    parser.add_argument(
        "--coordinator",
        choices=sorted(SIM_CONNECTOR),
        default="nixl",
        help="how prefill and decode legs meet (epp serve --coordinator); the simulators "
        "get the matching --kv-connector, and `sidecar` starts an `epp sidecar` per decode "
        "server",
    )
    parser.add_argument("--model", default="sim-model", help="model name the simulators serve")
    parser.add_argument(
        "--envoy-port", type=argtypes.port, default=8081, help="Envoy's listener port"
    )
    parser.add_argument(
        "--envoy-admin-port", type=argtypes.port, default=9901, help="Envoy's admin port"
    )
    parser.add_argument(
        "--grpc-port", type=argtypes.port, default=9002, help="EPP ext_proc gRPC port"
    )
    parser.add_argument(
        "--http-port", type=argtypes.port, default=9090, help="EPP HTTP (/metrics) port"
    )
    parser.add_argument(
        "--workers",
        type=argtypes.positive_int,
        default=1,
        help="EPP worker processes (epp serve --workers; the others on free ports, all "
        "listed in Envoy's ext_proc cluster; the EPP restarts a dead one on its port; "
        "docs/workers.md)",
    )
    parser.add_argument(
        "--replicas",
        type=argtypes.positive_int,
        default=1,
        help="EPP replicas side by side (active-active, docs/replicas.md): the first on "
        "--grpc-port/--http-port, the others on free ports, each an endpoint of Envoy's "
        "ext_proc cluster, sharing their in-flight counts; one that dies is started again "
        "on its ports",
    )
    parser.add_argument(
        "--processing",
        choices=PROCESSING_MODES,
        default="full",
        help="what Envoy sends the EPP: full (response body too), lean (response headers "
        "only) or buffered (lean, and the request body in one message, not echoed)",
    )
    parser.add_argument(
        "--cluster",
        choices=CLUSTER_KINDS,
        default="eds",
        help="how Envoy reaches the model servers: eds (endpoints served by the EPP, "
        "fallback list + retries: no client error when a server dies) or original-dst "
        "(the one address in the header; simpler, no failover)",
    )
    parser.add_argument(
        "--transport",
        choices=sorted(TRANSPORTS),
        default=DEFAULT_TRANSPORT,
        help="gRPC server the EPP serves ext_proc with (epp serve --transport)",
    )
    parser.add_argument(
        "--epp-tls",
        action="store_true",
        help="Envoy talks TLS to the EPP's gRPC port (ext_proc and EDS): the EPP serves a "
        "self-signed certificate (epp serve --tls-self-signed), Envoy does not verify it",
    )
    parser.add_argument(
        "--fail-open",
        action="store_true",
        help="Envoy fails open: while the EPP is unreachable, requests go round robin to "
        "the servers that decode (needs --processing buffered; docs/operations.md, Fail-open)",
    )
    for flag, default, what in (
        ("--first-byte-timeout", EnvoyOptions.first_byte_timeout_s, "non-streaming requests "
         "(their whole answer: Envoy then tries the next endpoint)"),
        ("--stream-idle-timeout", EnvoyOptions.stream_idle_timeout_s, "streaming requests: "
         "their first-byte budget (queue + prefill), and with --processing lean or buffered "
         "also the bound between chunks (before the response starts Envoy tries the next "
         "endpoint; after it, the stream is cut)"),
    ):  # fmt: skip
        parser.add_argument(
            flag,
            type=argtypes.positive_float,
            default=default,
            metavar="SECONDS",
            help=f"per attempt, the longest silence of a model server on {what}; docs/timeouts.md",
        )
    parser.add_argument(
        "--stream-chunk-timeout",
        type=argtypes.non_negative_float,
        default=CHUNK_TIMEOUT_S,
        metavar="SECONDS",
        help="the EPP ends a stream whose server sends nothing this long after its first "
        "byte, with an SSE error event (--processing full; 0: never); docs/timeouts.md",
    )
    parser.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="the EPP's config file (epp serve --config), e.g. configs/precise-prefix.yaml",
    )
    parser.add_argument(
        "--kv-events",
        action="store_true",
        help="the simulators publish KV events; the EPP gets them as config endpoints "
        "labelled with their publishers and its precise-prefix-cache-scorer the "
        "simulators' tokenizer (docs/kv-events.md)",
    )
    parser.add_argument(
        "--time-scale",
        type=argtypes.non_negative_float,
        default=1.0,
        help="simulators' latency multiplier (0 = instant answers)",
    )
    parser.add_argument(
        "--workdir", type=Path, help="where configs and logs go (default: a new temp dir)"
    )
    add_log_level(parser)


def run(args: argparse.Namespace) -> int:
    split = 0 if args.servers else 2
    prefill = split if args.prefill is None else args.prefill
    decode = split if args.decode is None else args.decode
    if args.servers + decode == 0:
        print("epp stack: nothing can decode: give --decode N or --servers N", file=sys.stderr)
        return 2
    if args.fail_open and args.processing != "buffered":
        print("epp stack: --fail-open needs --processing buffered", file=sys.stderr)
        return 2
    problem = check_config(args.config, kv_events=args.kv_events)
    if problem is not None:  # before any child starts
        print(f"epp stack: {problem}", file=sys.stderr)
        return 2
    opts = StackOptions(
        servers=args.servers,
        prefill=prefill,
        decode=decode,
        coordinator=args.coordinator,
        model=args.model,
        envoy_port=args.envoy_port,
        envoy_admin_port=args.envoy_admin_port,
        grpc_port=args.grpc_port,
        http_port=args.http_port,
        processing=args.processing,
        cluster=args.cluster,
        sim_args=["--time-scale", str(args.time_scale)],
        epp_args=[
            "--transport",
            args.transport,
            *(["--config", str(args.config)] if args.config else []),
        ],
        kv_events=args.kv_events,
        replicas=args.replicas,
        epp_tls=args.epp_tls,
        fail_open=args.fail_open,
        first_byte_timeout_s=args.first_byte_timeout,
        stream_idle_timeout_s=args.stream_idle_timeout,
        stream_chunk_timeout_s=args.stream_chunk_timeout,
        log_level=level_of(args),
        workdir=args.workdir,
        workers=args.workers,
    )
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    stack = LocalStack(opts)
    print(
        f"starting Envoy, the EPP and simulated model servers ({prefill} prefill, {decode} "
        f"decode, {opts.servers} plain{_coordinator(opts, '; ')})...",
        flush=True,
    )
    try:
        stack.start()
    except ProcessFailed as exc:
        print(f"epp stack: {exc}", file=sys.stderr)
        return 1
    print(banner(stack), flush=True)
    try:
        while not stop.wait(SUPERVISE_EVERY_S):
            for event in stack.supervise():
                print(f"epp stack: {event}", file=sys.stderr, flush=True)
    except StackDown as exc:
        print(f"epp stack: {exc}", file=sys.stderr)
        return 1
    finally:
        print("stopping...", flush=True)
        stack.stop()
        print("stopped.", flush=True)
    return 0


def check_config(path: Path | None, *, kv_events: bool = False) -> str | None:
    """What is wrong with the EPP's ``--config`` file (None: nothing), found before any
    child starts, as ``epp serve`` would find it."""
    if path is None:
        return None
    try:
        cfg = config.load(path)
        config.instantiate(cfg, config.builtin_registry())
    except (ConfigError, ExtensionError) as exc:
        return f"invalid config: {exc}"
    if kv_events and cfg.endpoints:
        return f"{path}: with --kv-events the stack lists the simulators; give no endpoints"
    return None


def _coordinator(opts: StackOptions, before: str) -> str:
    """The P/D coordinator, said only where there are prefill servers for it."""
    return f"{before}coordinator {opts.coordinator}" if opts.prefill else ""


def _config_in_use(opts: StackOptions, workdir: Path) -> str:
    at = opts.epp_args.index("--config") + 1 if "--config" in opts.epp_args else 0
    given = opts.epp_args[at] if at else "built in (`epp config show`)"
    if opts.kv_events:  # kv_events_config's copy, with the simulators as endpoints
        return f"{workdir / 'epp-config.yaml'} ({given}, with the simulators' KV events)"
    return given


def banner(stack: LocalStack) -> str:
    assert stack.envoy is not None
    url, model = stack.envoy_url, stack.opts.model
    admin = (
        "changes need X-Api-Key: $ADMIN_API_KEY"
        if os.environ.get("ADMIN_API_KEY")
        else "read-only: set ADMIN_API_KEY to allow changes"
    )
    args = stack.endpoint_args
    pairs = zip(args[::2], args[1::2], strict=True)
    servers = "\n".join(f"    {flag.lstrip('-'):<10} {address}" for flag, address in pairs)
    grpc_security = "TLS, self-signed" if stack.opts.epp_tls else "plaintext"
    workers = f", {stack.opts.workers} workers" if stack.opts.workers > 1 else ""
    ports = ",".join(map(str, stack.grpc_ports[: stack.opts.workers]))  # the first replica's
    replicas = "".join(
        f"  EPP replica {i}               gRPC {HOST}:{grpc}, HTTP http://{HOST}:{http}\n"
        for i, (grpc, http) in enumerate(stack.epp_ports[1:], start=1)
    )
    return f"""
epp stack is up.
  Envoy (send requests here)  {url}
  EPP ext_proc gRPC           {HOST}:{ports} ({grpc_security}{workers})
  EPP metrics                 {stack.epp_http_url}/metrics
  EPP admin API               {stack.epp_http_url}/status, /instances/add|remove ({admin})
{replicas}  Envoy admin                 {stack.envoy.admin_url}
  EPP config                  {_config_in_use(stack.opts, stack.workdir)}
  model servers               model {model}{_coordinator(stack.opts, ", ")}
{servers}
  logs and configs            {stack.workdir}

Try it:
  curl -s {url}/v1/completions -H 'content-type: application/json' \\
    -d '{{"model": "{model}", "prompt": "Hello, world", "max_tokens": 8}}'

  .venv/bin/python - <<'PY'
  from openai import OpenAI
  client = OpenAI(base_url="{url}/v1", api_key="unused")
  reply = client.chat.completions.create(
      model="{model}", messages=[{{"role": "user", "content": "Hi"}}], max_tokens=8)
  print(reply.choices[0].message.content)
  PY

Ctrl-C stops everything."""
