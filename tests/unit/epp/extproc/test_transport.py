"""The transports' wait for held replies: cancelled when the stream ends first, a
message that arrives meanwhile kept for after."""

from __future__ import annotations

import asyncio

from epp.extproc.transport import unless_closed


async def test_the_replies_when_they_come_first() -> None:
    receive: asyncio.Future[object] = asyncio.get_running_loop().create_future()
    assert await unless_closed(asyncio.sleep(0, result=["replies"]), receive) == ["replies"]
    assert not receive.done()  # still the caller's next message


async def test_a_stream_that_ends_first_cancels_the_wait() -> None:
    cancelled = asyncio.Event()

    async def held() -> list[str]:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return ["never"]

    receive: asyncio.Future[object] = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().call_later(0.01, receive.set_result, None)  # end of stream
    assert await unless_closed(held(), receive) is None
    assert cancelled.is_set()


async def test_a_message_meanwhile_waits_for_the_replies() -> None:
    receive: asyncio.Future[object] = asyncio.get_running_loop().create_future()
    receive.set_result("trailers")
    assert await unless_closed(asyncio.sleep(0.01, result=["replies"]), receive) == ["replies"]
    assert receive.result() == "trailers"
