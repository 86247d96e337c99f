"""Share in-flight counts with peers (replicas, workers) over ZMQ PUB/SUB.

Each process binds one PUB socket (``--peer-load-bind``) and publishes its own
in-flight table (:mod:`epp.datalayer.peerload`): at once when it changes, at most
every ``MIN_GAP_S``, and every ``HEARTBEAT_S`` anyway. One SUB socket connects to every
peer (``--peer-load-peers``; a host name is looked up every ``resolve_s`` and each
address it gives is followed, so a headless Service lists the replicas). What the peers
have in flight reaches the datastore, whose snapshots add it to this process's own.
ZMQ reconnects by itself; a frame that cannot be read is counted and dropped; nothing
here raises out of its tasks.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import logging
import secrets
import socket
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from epp.common import argtypes
from epp.common.lazymodule import lazy_module
from epp.common.looptask import LoopTask
from epp.datalayer.peerload import (
    EXPIRE_S,
    HEARTBEAT_S,
    MIN_GAP_S,
    TOPIC,
    FrameError,
    LoadFrame,
    PeerTables,
    decode,
    encode,
    nonzero,
)
from epp.datastore import Datastore

if TYPE_CHECKING:
    import zmq
    import zmq.asyncio
else:  # only with --peer-load-* (the flags are read in every `epp serve`)
    zmq = lazy_module("zmq", "zmq.asyncio")

log = logging.getLogger(__name__)

DEFAULT_RESOLVE_S = 5.0
TICK_S = 0.5  # heartbeats and expiry are checked this often
RECONNECT_S = (0.1, 2.0)  # ZMQ's reconnect backoff to a peer
STOP_LINGER_MS = 200  # how long the last frame (bye) may take to leave at stop
SCHEMES = ("tcp", "ipc")

# (host, port) -> the IP addresses it resolves to
Lookup = Callable[[str, int], Awaitable[list[str]]]


async def system_lookup(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(sockaddr[0]) for _, _, _, _, sockaddr in infos]


@dataclass(frozen=True)
class PeerOptions:
    bind: str | None = None  # where this process publishes (None: it does not)
    peers: tuple[str, ...] = ()  # whom it follows
    resolve_s: float = DEFAULT_RESOLVE_S

    @property
    def enabled(self) -> bool:
        return self.bind is not None or bool(self.peers)


def split_name(address: str) -> tuple[str, int] | None:
    """(host, port) of a ``tcp://NAME:PORT`` whose host is a name to look up; None for
    an IP address, a wildcard or another scheme (followed as written)."""
    scheme, _, rest = address.partition("://")
    host, _, port = rest.rpartition(":")
    if scheme != "tcp" or host in ("*", "") or host.startswith("[") or not port.isdigit():
        return None
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return host, int(port)
    return None


def zmq_address(value: str) -> str:
    """argparse type: ``tcp://HOST:PORT`` or ``ipc://PATH``."""
    scheme, sep, rest = value.partition("://")
    if not sep or scheme not in SCHEMES or not rest:
        raise argparse.ArgumentTypeError(
            f"{value!r}: give tcp://HOST:PORT or ipc://PATH (a ZMQ address)"
        )
    if scheme == "tcp":
        _, colon, port = rest.rpartition(":")
        if not colon or not (port == "*" or port.isdigit()):
            raise argparse.ArgumentTypeError(f"{value!r}: tcp:// needs HOST:PORT")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--peer-load-bind",
        type=zmq_address,
        metavar="ADDR",
        help="publish this process's in-flight counts here for its peers (e.g. "
        "tcp://0.0.0.0:9004; docs/replicas.md#sharing-in-flight-counts); default: not shared",
    )
    parser.add_argument(
        "--peer-load-peers",
        action="append",
        default=[],
        metavar="ADDR[,ADDR...]",
        help="follow these peers' in-flight counts (tcp://HOST:PORT or ipc://PATH; a host "
        "name is looked up again every --peer-load-resolve-seconds and every address it "
        "gives is followed, e.g. a headless Service); repeatable",
    )
    parser.add_argument(
        "--peer-load-resolve-seconds",
        type=argtypes.positive_float,
        default=DEFAULT_RESOLVE_S,
        help="how often host names in --peer-load-peers are looked up again",
    )


def from_args(args: argparse.Namespace) -> PeerOptions:
    """The options; ValueError naming the flag for an address that is not one."""
    peers: list[str] = []
    for value in args.peer_load_peers:
        for part in filter(None, (p.strip() for p in value.split(","))):
            try:
                peers.append(zmq_address(part))
            except argparse.ArgumentTypeError as exc:
                raise ValueError(f"--peer-load-peers: {exc}") from None
    return PeerOptions(args.peer_load_bind, tuple(peers), args.peer_load_resolve_seconds)


@dataclass(slots=True)
class PeerCounters:
    published: int = 0
    applied: int = 0  # frames taken
    ignored: int = 0  # this process's own, or repeated
    bad: int = 0  # not a frame of ours
    failures: int = 0  # receive loop errors (the loop goes on)


@dataclass
class _Followed:
    name: tuple[str, int] | None  # a host name to look up, or None: followed as written
    connected: set[str] = field(default_factory=set)


class PeerLoad:
    """Publishes this process's in-flight table and follows its peers'."""

    def __init__(
        self,
        datastore: Datastore,
        opts: PeerOptions,
        *,
        clock: Callable[[], float] = time.monotonic,
        lookup: Lookup = system_lookup,
        expire_s: float = EXPIRE_S,
    ) -> None:
        self.id = secrets.token_hex(8)
        self.opts = opts
        self.counters = PeerCounters()
        self.tables = PeerTables(self.id, expire_s)
        self._datastore = datastore
        self._clock = clock
        self._lookup = lookup
        self._seq = 0
        self._last = float("-inf")  # when the last frame left
        self._scheduled = False
        self._context: zmq.asyncio.Context | None = None
        self._pub: zmq.Socket[bytes] | None = None
        self._sub: zmq.asyncio.Socket | None = None
        self._followed = {a: _Followed(split_name(a)) for a in opts.peers}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks = [
            LoopTask("peer-load-receive", self._receive),
            LoopTask("peer-load-tick", self._tick),
        ]
        if any(f.name is not None for f in self._followed.values()):
            self._tasks.append(LoopTask("peer-load-resolve", self._resolve))

    @property
    def address(self) -> str | None:
        """Where this process publishes (a ``*`` port resolved), None if it does not."""
        if self._pub is None:
            return None
        return str(self._pub.getsockopt_string(zmq.LAST_ENDPOINT))

    @property
    def following(self) -> list[str]:
        """The addresses the SUB socket is connected to."""
        return sorted(a for f in self._followed.values() for a in f.connected)

    async def start(self) -> None:
        """Bind, connect and start the tasks; OSError naming the flag if the bind fails."""
        self._loop = asyncio.get_running_loop()
        self._context = zmq.asyncio.Context()
        sub = self._sub = self._context.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.IPV6, 1)
        sub.setsockopt(zmq.RECONNECT_IVL, int(RECONNECT_S[0] * 1000))
        sub.setsockopt(zmq.RECONNECT_IVL_MAX, int(RECONNECT_S[1] * 1000))
        sub.setsockopt(zmq.SUBSCRIBE, TOPIC)
        if self.opts.bind is not None:
            pub: zmq.Socket[bytes] = zmq.Socket(self._context, zmq.PUB)
            pub.setsockopt(zmq.IPV6, 1)
            pub.setsockopt(zmq.SNDHWM, 1000)  # a stuck peer loses old tables, never ours
            try:
                pub.bind(self.opts.bind)
            except zmq.ZMQError as exc:
                pub.close(linger=0)
                self._context.destroy(linger=0)
                self._context = None
                raise OSError(f"--peer-load-bind {self.opts.bind}: {exc}") from None
            self._pub = pub
            self._datastore.on_own_change(self._changed)
        for address, followed in self._followed.items():
            if followed.name is None:
                self._connect(followed, {address})
        for task in self._tasks:
            task.start()
        log.info(
            "sharing in-flight counts: publishing on %s, following %s",
            self.address or "nothing",
            ", ".join(self.opts.peers) or "nobody",
        )

    async def stop(self) -> None:
        """Tell the peers this process is gone (they drop its counts at once), close."""
        for task in self._tasks:
            await task.stop()
        if self._context is None:
            return
        if self._pub is not None:
            self._publish(bye=True)
            self._pub.close(linger=STOP_LINGER_MS)
            self._pub = None  # a publish still scheduled does nothing
        if self._sub is not None:
            self._sub.close(linger=0)
            self._sub = None
        context, self._context = self._context, None
        await asyncio.to_thread(context.term)  # until the bye left (at most the linger)

    def register(self, registry: CollectorRegistry) -> None:
        """Export the peers' counts and these counters (docs/metrics.md)."""
        registry.register(_PeerCollector(self))

    # -- publishing ----------------------------------------------------------------
    def _changed(self) -> None:
        """This process's counts changed: publish soon (at most every MIN_GAP_S)."""
        if self._scheduled or self._loop is None:
            return
        self._scheduled = True
        delay = max(self._last + MIN_GAP_S - self._clock(), 0.0)
        # never inside the request path: the frame leaves after the current callback
        self._loop.call_later(delay, self._publish)

    def _publish(self, bye: bool = False) -> None:
        self._scheduled = False
        if self._pub is None:
            return
        self._seq += 1
        frame = LoadFrame(
            self.id,
            self._seq,
            nonzero(self._datastore.own_in_flight),
            nonzero(self._datastore.own_in_flight_tokens),
            bye,
        )
        try:
            self._pub.send_multipart([TOPIC, encode(frame)], flags=zmq.NOBLOCK)
        except zmq.ZMQError as exc:  # PUB drops rather than blocks; never fail the loop
            log.debug("peer load: publish failed: %s", exc)
            return
        self._last = self._clock()
        self.counters.published += 1

    # -- following -------------------------------------------------------------------
    async def _receive(self) -> None:
        assert self._sub is not None
        while True:
            try:
                parts = await self._sub.recv_multipart()
                self.received(parts)
            except asyncio.CancelledError:
                raise
            except Exception:  # never let the loop end
                self.counters.failures += 1
                log.warning("peer load: receiving failed", exc_info=True)
                await asyncio.sleep(TICK_S)

    def received(self, parts: Sequence[bytes]) -> None:
        """One ZMQ message from a peer (its topic and frame)."""
        if len(parts) != 2 or parts[0] != TOPIC:
            self.counters.bad += 1
            return
        try:
            frame = decode(parts[1])
        except FrameError as exc:
            self.counters.bad += 1
            log.debug("peer load: dropped a frame: %s", exc)
            return
        changed = self.tables.apply(frame, self._clock())
        if changed is None:
            self.counters.ignored += 1
            return
        self.counters.applied += 1
        self._update(changed)

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(TICK_S)
            now = self._clock()
            if self._pub is not None and now - self._last >= HEARTBEAT_S:
                self._publish()
            self._update(self.tables.expire(now))

    def _update(self, changed: Iterable[str]) -> None:
        requests, tokens = self.tables.requests, self.tables.tokens
        loads = {a: (requests.get(a, 0), tokens.get(a, 0)) for a in changed}
        if loads:
            self._datastore.set_peer_load(loads)

    async def _resolve(self) -> None:
        while True:
            await self.resolve()
            await asyncio.sleep(self.opts.resolve_s)

    async def resolve(self) -> None:
        """Look every followed name up once more; follow what it gives now (a failed
        lookup keeps the addresses it gave last)."""
        for followed in self._followed.values():
            if followed.name is None:
                continue
            host, port = followed.name
            try:
                ips = await self._lookup(host, port)
            except OSError as exc:
                log.warning("peer load: cannot look %s up: %s", host, exc)
                continue
            self._connect(followed, {_tcp(ip, port) for ip in ips})

    def _connect(self, followed: _Followed, addresses: set[str]) -> None:
        assert self._sub is not None
        addresses.discard(self.opts.bind or "")  # this process itself
        for address in sorted(addresses - followed.connected):
            try:
                self._sub.connect(address)
            except zmq.ZMQError as exc:
                log.warning("peer load: cannot follow %s: %s", address, exc)
                continue
            followed.connected.add(address)
            log.info("peer load: following %s", address)
        for address in sorted(followed.connected - addresses):
            followed.connected.discard(address)
            with contextlib.suppress(zmq.ZMQError):  # ZMQ had dropped it already
                self._sub.disconnect(address)
            log.info("peer load: no longer following %s", address)


def _tcp(ip: str, port: int) -> str:
    return f"tcp://[{ip}]:{port}" if ":" in ip else f"tcp://{ip}:{port}"


class _PeerCollector(Collector):
    def __init__(self, peers: PeerLoad) -> None:
        self._peers = peers

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        p = self._peers
        yield GaugeMetricFamily(
            "epp_peers",
            "Peers (replicas, workers) whose in-flight counts this process follows now.",
            value=p.tables.live,
        )
        peer_in_flight = GaugeMetricFamily(
            "epp_peer_in_flight_requests",
            "Requests this process's peers report in flight, per endpoint (added to its own "
            "in scheduling).",
            labels=["endpoint"],
        )
        for address, n in sorted(p.tables.requests.items()):
            peer_in_flight.add_metric([address], n)
        yield peer_in_flight
        frames = CounterMetricFamily(
            "epp_peer_load_frames",
            "Peer-load frames received, by outcome (applied; ignored: own or repeated; "
            "bad: not a frame, dropped; error: the receive itself failed, retried).",
            labels=["outcome"],
        )
        for outcome, n in (
            ("applied", p.counters.applied),
            ("ignored", p.counters.ignored),
            ("bad", p.counters.bad),
            ("error", p.counters.failures),
        ):
            frames.add_metric([outcome], n)
        yield frames
        yield CounterMetricFamily(
            "epp_peer_load_published",
            "Frames of this process's in-flight table published to its peers.",
            value=p.counters.published,
        )
