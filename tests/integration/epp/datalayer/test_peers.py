"""Shared in-flight counts over real ZMQ sockets: two datastores in this process, each
with its own PeerLoad (docs/replicas.md#sharing-in-flight-counts); then two real
``epp serve`` processes."""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import signal
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import zmq
import zmq.asyncio

from epp.config import build_scheduler
from epp.datalayer.peerload import EXPIRE_S, HEARTBEAT_S, TOPIC, LoadFrame, encode
from epp.datalayer.peers import PeerLoad, PeerOptions
from epp.datastore import Datastore
from epp.observability.metrics import EppMetrics
from epp.types import Endpoint, InferenceRequest
from epp_harness.procs import ManagedProcess, spawn_epp
from tests.support.http import request
from tests.support.wait import until, wait_for

ROOT = Path(__file__).resolve().parents[4]
LEAST_REQUEST = (ROOT / "configs" / "least-request.yaml").read_text()
E1, E2 = Endpoint("10.0.0.1", 8000), Endpoint("10.0.0.2", 8000)


@dataclass
class Clock:
    """A side's clock: the machine's, or stopped where a test set it (a side whose clock
    stands still sends no heartbeats: it publishes only when its counts change)."""

    stopped: float | None = None

    def __call__(self) -> float:
        return time.monotonic() if self.stopped is None else self.stopped


@dataclass
class Side:
    datastore: Datastore
    peers: PeerLoad
    clock: Clock


def side(bind: str | None, *peers: str, expire_s: float = 3.5) -> Side:
    ds = Datastore()
    ds.add(E1)
    ds.add(E2)
    clock = Clock()
    return Side(ds, PeerLoad(ds, PeerOptions(bind, peers), expire_s=expire_s, clock=clock), clock)


@pytest.fixture
def sockets() -> Iterator[Path]:
    """A short directory for unix sockets (their paths have at most 107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="epp-peers-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def pair(sockets: Path) -> AsyncIterator[tuple[Side, Side]]:
    a_addr, b_addr = f"ipc://{sockets}/a", f"ipc://{sockets}/b"
    a, b = side(a_addr, b_addr), side(b_addr, a_addr)
    await a.peers.start()
    await b.peers.start()
    try:
        yield a, b
    finally:
        await a.peers.stop()
        await b.peers.stop()


async def test_a_request_held_on_one_side_shows_in_the_others_decisions(
    pair: tuple[Side, Side],
) -> None:
    a, b = pair
    await until(lambda: a.peers.tables.live == 1 and b.peers.tables.live == 1, "heartbeats")
    scheduler = build_scheduler(LEAST_REQUEST)
    request = InferenceRequest(request_id="r", model="m", path="/v1/completions")
    # no heartbeat from A now: what reaches B is the frame its change sent at once
    a.clock.stopped = time.monotonic()
    try:
        tickets = [a.datastore.acquire(E1.address, tokens=40) for _ in range(2)]
        began = time.monotonic()
        await until(lambda: b.datastore.snapshot().in_flight[E1.address] == 2, "A's requests in B")
        print(f"\nA's requests reached B in {1000 * (time.monotonic() - began):.1f} ms")
    finally:
        a.clock.stopped = None
    assert b.datastore.snapshot().in_flight_tokens[E1.address] == 80
    assert b.datastore.in_flight(E1.address) == 0  # B's own: none
    # B's least-request pick avoids the endpoint A loaded, every time
    picks = {
        scheduler.schedule(request, b.datastore.snapshot(), random.Random(i)).header_value
        for i in range(20)
    }
    assert picks == {E2.address}
    # B's own request adds to it; A sees it the same way
    mine = b.datastore.acquire(E2.address)
    await until(lambda: a.datastore.snapshot().in_flight[E2.address] == 1, "B's request in A")
    for ticket in tickets:
        ticket.release()
    mine.release()
    await until(lambda: b.datastore.snapshot().in_flight[E1.address] == 0, "A's ended in B")
    await until(lambda: a.datastore.snapshot().in_flight[E2.address] == 0, "B's ended in A")
    assert dict(a.datastore.peer_in_flight_table) == dict(b.datastore.peer_in_flight_table) == {}


async def test_a_peer_that_stops_is_forgotten_at_once(sockets: Path) -> None:
    a_addr = f"ipc://{sockets}/a"
    # B would wait an hour for A's silence: A is forgotten by its bye alone
    a, b = side(a_addr), side(None, a_addr, expire_s=3600)
    await a.peers.start()
    await b.peers.start()
    try:
        a.datastore.acquire(E1.address)
        await until(lambda: b.datastore.snapshot().in_flight[E1.address] == 1, "A's count")
        await a.peers.stop()  # says bye: no wait for the expiry
        await until(lambda: b.peers.tables.live == 0, "A gone")
        assert b.datastore.snapshot().in_flight[E1.address] == 0
    finally:
        await b.peers.stop()


async def test_a_silent_peer_expires_and_bad_frames_are_counted_and_dropped(
    sockets: Path,
) -> None:
    """A peer that dies just stops sending: this test is that peer, on a raw socket."""
    address = f"ipc://{sockets}/raw"
    context = zmq.asyncio.Context()
    pub = context.socket(zmq.PUB)
    pub.bind(address)
    b = side(None, address, expire_s=0.6)
    await b.peers.start()
    try:

        async def send(*parts: bytes) -> None:
            await pub.send_multipart(list(parts))

        frame = LoadFrame("dead", 1, {E1.address: 3}, {E1.address: 30})
        for _ in range(100):  # until the SUB socket has joined (ZMQ's slow joiner)
            await send(TOPIC, encode(frame))
            if b.peers.tables.live:
                break
            await asyncio.sleep(0.02)
        assert b.datastore.snapshot().in_flight[E1.address] == 3
        bad = b.peers.counters.bad
        await send(TOPIC, b"\xc1not msgpack")
        await send(TOPIC, encode(frame), b"a third part")
        began = time.monotonic()  # before its last frame: its silence starts after
        await send(TOPIC, encode(LoadFrame("dead", 2, {E1.address: 4}, {})))
        await until(lambda: b.datastore.snapshot().in_flight[E1.address] == 4, "the next frame")
        assert b.peers.counters.bad == bad + 2
        await until(lambda: b.peers.tables.live == 0, "the silent peer dropped", within=3.0)
        assert time.monotonic() - began >= 0.6  # expire_s after that frame
        assert b.datastore.snapshot().in_flight[E1.address] == 0
        registry = EppMetrics(b.datastore).registry
        b.peers.register(registry)
        frames = registry.get_sample_value("epp_peer_load_frames_total", {"outcome": "bad"})
        assert frames == bad + 2
        # the receive never failed: bad frames are not errors
        assert registry.get_sample_value("epp_peer_load_frames_total", {"outcome": "error"}) == 0
        assert registry.get_sample_value("epp_peers") == 0
    finally:
        await b.peers.stop()
        pub.close(linger=0)
        context.term()


async def test_a_host_name_is_followed_at_every_address_it_gives() -> None:
    a = side("tcp://127.0.0.1:*")
    await a.peers.start()
    assert a.peers.address is not None
    port = int(a.peers.address.rsplit(":", 1)[1])
    b = side(None, f"tcp://localhost:{port}")
    await b.peers.start()
    try:
        await until(lambda: f"tcp://127.0.0.1:{port}" in b.peers.following, "localhost resolved")
        a.datastore.acquire(E2.address)
        await until(lambda: b.datastore.snapshot().in_flight[E2.address] == 1, "A's count")
    finally:
        await b.peers.stop()
        await a.peers.stop()


# -- two real `epp serve` processes ------------------------------------------------------
def peers_gauge(http_port: int) -> float | None:
    status, _, body = request(f"http://127.0.0.1:{http_port}/metrics")
    assert status == 200
    for line in body.decode().splitlines():
        if line.startswith("epp_peers "):
            return float(line.split()[1])
    return None


def start(tmp_path: Path, name: str, bind: str, peer: str) -> ManagedProcess:
    return spawn_epp(
        tmp_path, name, "serve", "--grpc-port", "0", "--http-port", "0",
        "--grpc-health-port", "0", "--endpoint", "127.0.0.1:1",
        "--peer-load-bind", bind, "--peer-load-peers", peer,
    )  # fmt: skip


def test_two_serve_processes_follow_each_other_and_forget_a_killed_one(
    tmp_path: Path, sockets: Path
) -> None:
    a_addr, b_addr = f"ipc://{sockets}/a", f"ipc://{sockets}/b"
    procs = [start(tmp_path, "a", a_addr, b_addr), start(tmp_path, "b", b_addr, a_addr)]
    try:
        ports = [int(p.wait_ready()["http_port"]) for p in procs]
        wait_for(
            lambda: [peers_gauge(port) for port in ports] == [1, 1], what="each follows the other"
        )
        began = time.monotonic()  # its last heartbeat left at most HEARTBEAT_S before
        os.kill(procs[0].pid, signal.SIGKILL)  # no bye: its heartbeats just stop
        wait_for(lambda: peers_gauge(ports[1]) == 0, timeout=60, what="the killed one dropped")
        # not at once: EXPIRE_S after its last heartbeat
        assert time.monotonic() - began >= EXPIRE_S - HEARTBEAT_S
    finally:
        for p in procs:
            p.stop()
