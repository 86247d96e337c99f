"""What peers have in flight: their frames and the merged table (pure).

Every EPP process that shares its load (a replica, a worker of ``--workers``) publishes
its own in-flight table: per endpoint, the requests it routed there and has not seen
end, and their estimated tokens, non-zero entries only, the whole table each time (so a
lost frame loses nothing the next one does not repeat). A process keeps, per peer (a
random id made at its start), the last table it got, and sums them per endpoint. A peer
silent for ``expire_s`` is dropped and its counts vanish; a peer that stops cleanly says
so (``bye``). :mod:`epp.datalayer.peers` moves the frames; this module only decides.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated

import msgspec

from epp.errors import InternalError

TOPIC = b"epp-peer-load/1"  # the first ZMQ frame of every message (SUB filters on it)
HEARTBEAT_S = 1.0  # a table is published at least this often, changed or not
EXPIRE_S = 3.5  # a peer silent this long is dropped (three heartbeats and a margin)
MIN_GAP_S = 0.005  # at most one publish per this, however often the table changes

Count = Annotated[int, msgspec.Meta(ge=0)]


class LoadFrame(msgspec.Struct, array_like=True, frozen=True):
    """One publisher's whole table. ``seq`` grows by one per frame from its start, so a
    frame that arrives twice (a peer followed under two addresses) is applied once."""

    peer: str
    seq: int
    requests: dict[str, Count]
    tokens: dict[str, Count]
    bye: bool = False  # the publisher is stopping: drop it now


class FrameError(InternalError, ValueError):
    """Bytes that are not a :class:`LoadFrame`."""


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(LoadFrame)


def encode(frame: LoadFrame) -> bytes:
    return _encoder.encode(frame)


def decode(data: bytes) -> LoadFrame:
    try:
        return _decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise FrameError(str(exc)) from None


@dataclass(slots=True)
class _Peer:
    seq: int
    seen: float
    requests: dict[str, int]
    tokens: dict[str, int]


@dataclass
class PeerTables:
    """The last table of every live peer and their sums per endpoint.

    :meth:`apply` and :meth:`expire` return the endpoints whose sums changed, so the
    caller updates only those."""

    own: str  # this process's id: its own frames (a name that lists it too) are ignored
    expire_s: float = EXPIRE_S
    requests: dict[str, int] = field(default_factory=dict)  # summed over peers, non-zero
    tokens: dict[str, int] = field(default_factory=dict)
    _peers: dict[str, _Peer] = field(default_factory=dict)

    @property
    def live(self) -> int:
        return len(self._peers)

    def apply(self, frame: LoadFrame, now: float) -> set[str] | None:
        """Take ``frame`` as its peer's table; None if it was ignored (this process's
        own, or not newer than the last from that peer)."""
        if frame.peer == self.own:
            return None
        peer = self._peers.get(frame.peer)
        if peer is not None and frame.seq <= peer.seq:
            return None
        if frame.bye:
            return self._forget(frame.peer)
        empty: dict[str, int] = {}
        changed = self._add(peer.requests if peer else empty, frame.requests, self.requests)
        changed |= self._add(peer.tokens if peer else empty, frame.tokens, self.tokens)
        # the decoded frame's own dicts (nothing else holds them)
        self._peers[frame.peer] = _Peer(frame.seq, now, frame.requests, frame.tokens)
        return changed

    def expire(self, now: float) -> set[str]:
        """Drop the peers silent for ``expire_s``; the endpoints whose sums changed."""
        changed: set[str] = set()
        for name in [n for n, p in self._peers.items() if now - p.seen >= self.expire_s]:
            changed |= self._forget(name)
        return changed

    def _forget(self, name: str) -> set[str]:
        peer = self._peers.pop(name, None)
        if peer is None:
            return set()
        return self._add(peer.requests, {}, self.requests) | self._add(peer.tokens, {}, self.tokens)

    @staticmethod
    def _add(old: dict[str, int], new: dict[str, int], sums: dict[str, int]) -> set[str]:
        """Replace ``old`` by ``new`` in ``sums``; the addresses whose sum changed."""
        # the entries that differ, found by C-level set operations (a frame repeats
        # most of the last one)
        changed = {address for address, _ in old.items() ^ new.items()}
        for address in changed:
            _bump(sums, address, new.get(address, 0) - old.get(address, 0))
        return changed


def _bump(sums: dict[str, int], address: str, delta: int) -> None:
    total = sums.get(address, 0) + delta
    if total > 0:
        sums[address] = total
    else:
        sums.pop(address, None)


def nonzero(counts: Mapping[str, int]) -> dict[str, int]:
    """``counts`` without its zero entries (what a frame carries)."""
    return {a: n for a, n in counts.items() if n}
