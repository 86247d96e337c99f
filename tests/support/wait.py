"""Poll a condition until it holds (tests wait on state, never on fixed sleeps).

``wait_for`` blocks (for tests driving servers in other processes); ``until`` awaits
between polls, for tests whose code under test runs on the same event loop;
``quiesce`` waits until a stack's EPPs have nothing open, for tests that compare their
counters.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, TypeVar

from epp_harness.stack import HOST
from tests.support.http import metric_sum, request

if TYPE_CHECKING:
    from epp_harness.stack import LocalStack

T = TypeVar("T")
# What an EPP has open while a request's work is not over: its ext_proc streams (each
# counted in epp_extproc_streams_total only as it ends, which can be after the client
# had its answer) and the requests it routed (released as their responses end).
OPEN_WORK = ("epp_extproc_open_streams", "epp_in_flight_requests")
# A safety bound only: quiesce returns as soon as nothing is open.
QUIESCE_S = 60.0


def _polls(timeout: float, what: str, last: list[object]) -> Iterator[float]:
    """Delays between polls (5 ms doubling to 100 ms) until ``timeout``, then fail."""
    deadline = time.monotonic() + timeout
    delay = 0.005
    while time.monotonic() <= deadline:
        yield delay
        delay = min(delay * 2, 0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last[0]!r})")


def wait_for(check: Callable[[], T], timeout: float = 10.0, what: str = "condition") -> T:
    last: list[object] = [None]
    for delay in _polls(timeout, what, last):
        value = check()
        if value:
            return value
        last[0] = value
        time.sleep(delay)
    raise AssertionError("unreachable")


async def until(check: Callable[[], T], what: str = "condition", within: float = 10.0) -> T:
    last: list[object] = [None]
    for delay in _polls(within, what, last):
        value = check()
        if value:
            return value
        last[0] = value
        await asyncio.sleep(delay)
    raise AssertionError("unreachable")


def quiesce(stack: LocalStack, within: float = QUIESCE_S) -> None:
    """Wait until every EPP process of ``stack`` (each replica; a replica's workers are
    merged on its page) has no ext_proc stream open and no request in flight, so that
    everything earlier requests will count is counted. A test comparing the EPP's
    counters calls it before reading the values it starts from and before reading
    those it compares with them."""
    quiesce_epps([f"http://{HOST}:{http}" for _, http in stack.epp_ports], within)


def quiesce_epps(epp_http_urls: Iterable[str], within: float = QUIESCE_S) -> None:
    """:func:`quiesce` for EPPs given by their HTTP base URLs."""
    urls = list(epp_http_urls)
    last: list[object] = [None]
    what = f"no open ext_proc streams and no requests in flight ({', '.join(OPEN_WORK)} at 0)"
    for delay in _polls(within, what, last):
        still_open = {url: work for url in urls if (work := _open_work(url))}
        if not still_open:
            return
        last[0] = still_open
        time.sleep(delay)
    raise AssertionError("unreachable")


def _open_work(epp_http_url: str) -> dict[str, float]:
    """What the EPP at ``epp_http_url`` still has open, by metric (none: empty)."""
    _, _, body = request(f"{epp_http_url}/metrics")
    text = body.decode()
    assert f"# TYPE {OPEN_WORK[0]} gauge" in text, f"{epp_http_url}/metrics has no {OPEN_WORK[0]}"
    totals = {name: metric_sum(text, name) for name in OPEN_WORK}
    return {name: n for name, n in totals.items() if n}
