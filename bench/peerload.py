"""What sharing in-flight counts costs per frame (docs/replicas.md#sharing-in-flight-counts):
building and encoding this process's table (publish), and decoding a peer's frame,
merging it and updating the datastore (receive), with ``N`` endpoints that all have
requests open (a frame's worst case) and one entry changed since the last frame.
Prints the numbers; writes nothing.

    python -m bench.peerload --endpoints 100 1000
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from epp.datalayer.peerload import LoadFrame, PeerTables, decode, encode, nonzero
from epp.datastore import Datastore
from epp.types import Endpoint


def per_call_us(fn: Callable[[], object], min_s: float = 0.5) -> float:
    """Best of 5 runs of the mean time of ``fn`` in microseconds."""
    best = float("inf")
    for _ in range(5):
        n, began = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - began) < min_s / 5:
            fn()
            n += 1
        best = min(best, elapsed / n)
    return best * 1e6


def measure(endpoints: int) -> dict[str, float]:
    own = Datastore()
    addresses = [f"10.{i // 250}.{i % 250}.1:8000" for i in range(endpoints)]
    for address in addresses:
        own.add(Endpoint(address.rsplit(":", 1)[0], 8000))
        for _ in range(3):
            own.acquire(address, tokens=400)

    def publish() -> bytes:
        table = LoadFrame("me", 1, nonzero(own.own_in_flight), nonzero(own.own_in_flight_tokens))
        return encode(table)

    frame = publish()
    receiver = Datastore()
    tables = PeerTables("other")
    seq = [0]
    # alternate between two tables that differ in one entry, as after one request
    changed = decode(frame)
    other = LoadFrame(
        changed.peer,
        0,
        {**changed.requests, addresses[0]: 4},
        {**changed.tokens, addresses[0]: 1600},
    )
    frames = [frame, encode(other)]

    def receive() -> None:
        seq[0] += 1
        got = decode(frames[seq[0] % 2])
        got = LoadFrame(got.peer, seq[0], got.requests, got.tokens)
        diff = tables.apply(got, 0.0) or set()
        receiver.set_peer_load(
            {a: (tables.requests.get(a, 0), tables.tokens.get(a, 0)) for a in diff}
        )

    return {
        "bytes": float(len(frame)),
        "publish_us": per_call_us(publish),
        "receive_us": per_call_us(receive),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.peerload", description=__doc__)
    parser.add_argument("--endpoints", type=int, nargs="+", default=[100, 1000])
    args = parser.parse_args(argv)
    print("| endpoints with requests open | frame bytes | publish µs | receive + merge µs |")
    print("|---:|---:|---:|---:|")
    for n in args.endpoints:
        r = measure(n)
        print(f"| {n:,} | {r['bytes']:,.0f} | {r['publish_us']:.1f} | {r['receive_us']:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
