"""SGLang's bootstrap rendezvous, as the prefill instance serves it.

The prefill leg and the decode leg of one request name the same ``bootstrap_room``.
As in SGLang, the prefill waits in the room until the decode side has joined (the
decode must be ready to receive before anything is sent), then computes the prefill
and hands the KV over; the decode side waits in the room for that KV. Either side
gives up after its timeout. So a proxy that sends the decode leg only once the prefill
leg has answered deadlocks until the prefill's timeout.

A room exists while someone is in it; whoever arrives first creates it. Failures are
SimErrors naming the room: 504 on a timeout, 500 on an abort, 409 on a second decode.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager

from epp_harness.sim.protocol import SimError


class _Room:
    __slots__ = ("joined", "kv", "occupants")

    def __init__(self) -> None:
        self.joined = asyncio.Event()
        # the prompt tokens whose KV the prefill hands over
        self.kv: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.occupants = 0


class Rooms:
    """The rooms of one prefill instance, keyed by ``bootstrap_room``."""

    def __init__(self) -> None:
        self._rooms: dict[int, _Room] = {}

    def __len__(self) -> int:
        return len(self._rooms)

    @contextmanager
    def _enter(self, room_id: int) -> Iterator[_Room]:
        room = self._rooms.get(room_id)
        if room is None:
            room = self._rooms[room_id] = _Room()
        room.occupants += 1
        try:
            yield room
        finally:
            room.occupants -= 1
            if room.occupants == 0 and self._rooms.get(room_id) is room:
                del self._rooms[room_id]
                if not room.kv.done():
                    room.kv.cancel()

    @contextmanager
    def prefill(self, room_id: int) -> Iterator[PrefillSide]:
        """The prefill leg's stay in the room: wait for the decode with
        ``joined``, compute, then ``hand_over``. Leaving without handing over tells a
        waiting decode at once that the prefill was aborted."""
        with self._enter(room_id) as room:
            side = PrefillSide(room_id, room)
            try:
                yield side
            finally:
                if not room.kv.done():
                    room.kv.set_exception(
                        SimError(500, f"bootstrap room {room_id}: the prefill was aborted")
                    )
                    room.kv.exception()  # retrieved here, so an empty room logs nothing

    async def join(self, room_id: int, within: float) -> int:
        """The decode side: join the room and wait for the prefill's KV (its prompt
        tokens). Raises SimError on timeout, abort, or a second decode joining."""
        with self._enter(room_id) as room:
            if room.joined.is_set():
                raise SimError(409, f"bootstrap room {room_id}: a decode instance already joined")
            room.joined.set()
            done, _ = await asyncio.wait({room.kv}, timeout=within)
            if not done:
                raise SimError(
                    504,
                    f"bootstrap room {room_id}: no prefill handed over KV within {within:g}s",
                )
            if room.kv.cancelled():
                raise SimError(500, f"bootstrap room {room_id}: the prefill left the room")
            return room.kv.result()


class PrefillSide:
    """What the prefill leg does in its room (see ``Rooms.prefill``)."""

    def __init__(self, room_id: int, room: _Room) -> None:
        self.room_id = room_id
        self._room = room

    async def wait_for_decode(self, within: float) -> None:
        """Return once a decode instance joined; SimError 504 after ``within`` seconds."""
        if self._room.joined.is_set():
            return
        try:
            await asyncio.wait_for(self._room.joined.wait(), within)
        except TimeoutError:
            raise SimError(
                504,
                f"bootstrap room {self.room_id}: no decode instance joined within "
                f"{within:g}s (prefill and decode legs must be sent at the same time)",
            ) from None

    def hand_over(self, prompt_tokens: int) -> None:
        if not self._room.kv.done():
            self._room.kv.set_result(prompt_tokens)
