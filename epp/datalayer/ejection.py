"""Failing endpoints leave the pool, with exponential backoff, and come back when they
answer again.

Signals: a failure is a connect failure or 5xx seen on the response path, or a scrape
that could not reach the server (connect error, timeout); a success is anything the
server got right: a response below 500, a prefill leg answered 2xx, a scrape. Any
success resets the count of consecutive failures. A scrape that *timed out* is a slow
answer, not a dead server: it is a failure only when nothing from that server
succeeded within ``slow_grace_s`` (a busy engine is often slow to render ``/metrics``
while it serves requests well).

* ``eject_after`` consecutive failures eject an active endpoint for ``backoff_s``,
  doubling with every further ejection up to ``max_backoff_s``.
* When the backoff has passed, the endpoint is probed (``/health``, and the model when
  one is configured); success reinstates it and clears its record, failure ejects it
  again for longer.
* An endpoint still failing ``remove_after_s`` after it was first ejected is removed
  from the pool (through the datastore, so requests still in flight drain), unless
  ``keep_ejected`` or ``remove_after_s`` is 0; the last probe runs at that deadline.
  The default outlasts a model-server restart (minutes for vLLM loading a model).
* Every ``tick_s`` the loop also drops draining endpoints past their deadline.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from epp.common.looptask import LoopTask
from epp.datastore import Datastore, Status

log = logging.getLogger(__name__)

Probe = Callable[[str], Awaitable[str | None]]


@dataclass(frozen=True)
class EjectionPolicy:
    eject_after: int = 3  # 0 = never eject
    backoff_s: float = 1.0
    max_backoff_s: float = 30.0
    remove_after_s: float = 600.0  # failing this long after the first ejection; 0 = never
    keep_ejected: bool = False
    slow_grace_s: float = 30.0  # a scrape timeout this soon after a success is no failure

    def backoff(self, ejections: int) -> float:
        """Time out of the pool after the ``ejections``-th ejection in a row (1-based)."""
        return float(min(self.backoff_s * 2 ** (ejections - 1), self.max_backoff_s))


@dataclass(frozen=True, slots=True)
class FailureState:
    failures: int = 0  # consecutive
    next_probe_in_s: float | None = None  # ejected: until the next probe
    removal_in_s: float | None = None  # ejected: until it is removed if still failing


@dataclass(slots=True)
class _Record:
    failures: int = 0  # consecutive
    ejections: int = 0  # consecutive, without a recovery in between
    until: float = 0.0  # ejected: when to probe next
    failing_since: float | None = None  # when the first ejection of this streak began
    # a failure in serving (a 5xx answer), which reaching the server does not undo
    serving: bool = False


class Ejector:
    def __init__(
        self,
        datastore: Datastore,
        policy: EjectionPolicy,
        probe: Probe,
        *,
        clock: Callable[[], float] = time.monotonic,
        tick_s: float | None = None,
    ) -> None:
        self._datastore = datastore
        self.policy = policy
        self._probe = probe
        self._clock = clock
        # never 0: a zero backoff must not turn this loop into a busy one
        self._tick_s = tick_s if tick_s is not None else min(0.25, max(policy.backoff_s / 4, 0.01))
        self._records: dict[str, _Record] = {}
        self._last_success: dict[str, float] = {}
        self._probing: set[str] = set()
        self._loop = LoopTask("ejection", self._run)
        datastore.on_change(self._forget_gone)

    # -- signals (synchronous: called from the request path and the scraper) -------------
    def failure(self, address: str, reason: str, slow: bool = False, serving: bool = False) -> None:
        """One failure; ``slow``: the server did not answer in time (a scrape timeout),
        ignored while it has succeeded at something within ``slow_grace_s``;
        ``serving``: it answered, wrongly (a 5xx), so a scrape that works does not
        reset the count."""
        member = self._datastore.member(address)
        if not self.policy.eject_after or member is None or member.status is not Status.ACTIVE:
            return  # off; or ejected ones are judged by their probes only
        if slow:
            last = self._last_success.get(address)
            if last is not None and self._clock() - last < self.policy.slow_grace_s:
                return
        record = self._records.setdefault(address, _Record())
        record.failures += 1
        record.serving |= serving
        if record.failures >= self.policy.eject_after:
            self._eject(address, record, reason)

    def success(self, address: str, serving: bool = True) -> None:
        """Anything the server got right: resets its consecutive failures (an ejected
        one still waits for its probe). ``serving=False`` (a scrape that worked: the
        server is reachable) resets only failures to reach it, not 5xx answers."""
        member = self._datastore.member(address)
        if member is None:
            return
        self._last_success[address] = self._clock()
        if member.status is Status.ACTIVE:
            record = self._records.get(address)
            if record is not None and (serving or not record.serving):
                del self._records[address]

    def state(self, address: str) -> FailureState:
        """What /status shows about ``address``'s failures."""
        record = self._records.get(address)
        if record is None:
            return FailureState()
        member = self._datastore.member(address)
        if member is None or member.status is not Status.EJECTED:
            return FailureState(record.failures)
        now = self._clock()
        deadline = self._removal_deadline(record)
        return FailureState(
            record.failures,
            max(record.until - now, 0.0),
            None if deadline is None else max(deadline - now, 0.0),
        )

    def _removal_deadline(self, record: _Record) -> float | None:
        p = self.policy
        if record.failing_since is None or p.keep_ejected or not p.remove_after_s:
            return None
        return record.failing_since + p.remove_after_s

    # -- the loop ---------------------------------------------------------------------------
    def start(self) -> None:
        self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()

    async def _run(self) -> None:
        probes: set[asyncio.Task[None]] = set()
        try:
            while True:
                self._datastore.expire_drains()
                for address in self._due():
                    self._probing.add(address)
                    task = asyncio.get_running_loop().create_task(self._recheck(address))
                    probes.add(task)
                    task.add_done_callback(probes.discard)
                await asyncio.sleep(self._tick_s)
        finally:
            for task in probes:
                task.cancel()
            await asyncio.gather(*probes, return_exceptions=True)

    def _due(self) -> list[str]:
        now = self._clock()
        return [
            m.address
            for m in self._datastore.members()
            if m.status is Status.EJECTED
            and m.address not in self._probing
            and self._records.get(m.address, _Record()).until <= now
        ]

    async def _recheck(self, address: str) -> None:
        try:
            reason = await self._probe(address)
        finally:
            self._probing.discard(address)
        record = self._records.get(address)
        if record is None:  # gone meanwhile
            return
        if reason is None:
            if self._datastore.reinstate(address):
                del self._records[address]
                log.info("endpoint %s answers again; back in the pool", address)
            return
        record.failures += 1
        self._eject(address, record, f"probe: {reason}")

    def _eject(self, address: str, record: _Record, reason: str) -> None:
        p = self.policy
        now = self._clock()
        if record.failing_since is None:
            record.failing_since = now
        deadline = self._removal_deadline(record)
        if deadline is not None and now >= deadline:
            log.warning(
                "endpoint %s still failing %gs after it was ejected (%d failures in a row, "
                "last: %s); removing it",
                address,
                p.remove_after_s,
                record.failures,
                reason,
            )
            self._records.pop(address, None)
            self._datastore.remove(address)
            return
        record.ejections += 1
        backoff = p.backoff(record.ejections)
        # the last probe runs at the removal deadline, not up to a backoff after it
        record.until = now + backoff if deadline is None else min(now + backoff, deadline)
        if self._datastore.eject(address):
            log.warning(
                "endpoint %s ejected for %gs after %d consecutive failure(s) (last: %s)",
                address,
                backoff,
                record.failures,
                reason,
            )
        else:
            log.info("endpoint %s still failing (%s); next check in %gs", address, reason, backoff)

    def _forget_gone(self) -> None:
        for table in (self._records, self._last_success):
            for address in [a for a in table if self._datastore.member(a) is None]:
                del table[address]
