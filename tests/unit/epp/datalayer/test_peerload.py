"""Peer-load frames and the merged table: plain data and a fake clock."""

from __future__ import annotations

import msgspec
import pytest

from epp.datalayer.peerload import (
    FrameError,
    LoadFrame,
    PeerTables,
    decode,
    encode,
    nonzero,
)

A, B = "10.0.0.1:8000", "10.0.0.2:8000"


def frame(peer: str, seq: int, requests: dict[str, int], bye: bool = False) -> LoadFrame:
    return LoadFrame(peer, seq, requests, {a: 100 * n for a, n in requests.items()}, bye)


def test_a_frame_round_trips() -> None:
    f = frame("p1", 7, {A: 2, B: 1})
    assert decode(encode(f)) == f


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xc1",  # never used in msgpack
        msgspec.msgpack.encode(["p", 1, {A: 1}]),  # a field missing
        msgspec.msgpack.encode(["p", 1, {A: -1}, {}]),  # a negative count
        msgspec.msgpack.encode(["p", "1", {}, {}]),  # a string for a number
        msgspec.msgpack.encode({"peer": "p"}),
    ],
)
def test_what_is_not_a_frame_is_a_frame_error(data: bytes) -> None:
    with pytest.raises(FrameError):
        decode(data)


def test_peers_tables_are_summed_and_replaced_whole() -> None:
    t = PeerTables("me")
    assert t.apply(frame("p1", 1, {A: 2}), now=0.0) == {A}
    assert t.apply(frame("p2", 1, {A: 1, B: 3}), now=0.0) == {A, B}
    assert (t.requests, t.tokens) == ({A: 3, B: 3}, {A: 300, B: 300})
    # p1's next table names B only: its A is gone (the whole table, not a delta)
    assert t.apply(frame("p1", 2, {B: 1}), now=0.1) == {A, B}
    assert t.requests == {A: 1, B: 4}
    assert t.live == 2
    # an unchanged table changes nothing
    assert t.apply(frame("p1", 3, {B: 1}), now=0.2) == set()


def test_own_frames_and_old_or_repeated_ones_are_ignored() -> None:
    t = PeerTables("me")
    assert t.apply(frame("me", 1, {A: 5}), now=0.0) is None
    assert t.apply(frame("p1", 4, {A: 1}), now=0.0) == {A}
    assert t.apply(frame("p1", 4, {A: 9}), now=0.0) is None  # the same frame, twice
    assert t.apply(frame("p1", 3, {A: 9}), now=0.0) is None  # older than the last
    assert t.requests == {A: 1}


def test_a_silent_peer_expires_and_its_counts_vanish() -> None:
    t = PeerTables("me", expire_s=3.0)
    t.apply(frame("p1", 1, {A: 2}), now=0.0)
    t.apply(frame("p2", 1, {A: 1}), now=0.0)
    t.apply(frame("p2", 2, {A: 1}), now=2.0)  # p2's heartbeat
    assert t.expire(now=2.9) == set()
    assert t.expire(now=3.0) == {A}  # p1 silent for 3 s
    assert (t.requests, t.live) == ({A: 1}, 1)
    assert t.expire(now=5.0) == {A}
    assert (t.requests, t.tokens, t.live) == ({}, {}, 0)


def test_a_peer_that_says_bye_is_dropped_at_once() -> None:
    t = PeerTables("me")
    t.apply(frame("p1", 1, {A: 2, B: 1}), now=0.0)
    assert t.apply(frame("p1", 2, {}, bye=True), now=0.1) == {A, B}
    assert (t.requests, t.live) == ({}, 0)
    # a restarted peer is a new id: its frames count from its own start
    assert t.apply(frame("p1-again", 1, {A: 1}), now=0.2) == {A}


def test_tables_carry_only_non_zero_entries() -> None:
    assert nonzero({A: 0, B: 2}) == {B: 2}
