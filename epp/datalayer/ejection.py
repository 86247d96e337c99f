"""Failing endpoints leave the pool, with exponential backoff, and come back when they
answer again.

Signals: a failure is a connect failure or 5xx seen on the response path, or a scrape
that could not reach the server (connect error, timeout); a success is a response
below 500. A scrape that reaches the server does not count as success: a server whose
``/metrics`` answers may still fail every request.

* ``eject_after`` consecutive failures eject an active endpoint for ``backoff_s``,
  doubling with every further ejection up to ``max_backoff_s``.
* When the backoff has passed, the endpoint is probed (``/health``, and the model when
  one is configured); success reinstates it and clears its record, failure counts as one
  more failure and ejects it again for longer.
* After ``max_failures`` consecutive failures it is removed from the pool (through the
  datastore, so requests still in flight drain), unless ``keep_ejected``.
* Every ``tick_s`` the loop also drops draining endpoints past their deadline.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from epp.datastore import Datastore, Status
from epp.looptask import LoopTask

log = logging.getLogger(__name__)

Probe = Callable[[str], Awaitable[str | None]]


@dataclass(frozen=True)
class EjectionPolicy:
    eject_after: int = 3  # 0 = never eject
    backoff_s: float = 1.0
    max_backoff_s: float = 30.0
    max_failures: int = 10  # 0 = never remove
    keep_ejected: bool = False

    def backoff(self, ejections: int) -> float:
        """Time out of the pool after the ``ejections``-th ejection in a row (1-based)."""
        return float(min(self.backoff_s * 2 ** (ejections - 1), self.max_backoff_s))


@dataclass(slots=True)
class _Record:
    failures: int = 0  # consecutive
    ejections: int = 0  # consecutive, without a recovery in between
    until: float = 0.0  # ejected: when to probe next
    reasons: list[str] = field(default_factory=list)


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
        self._probing: set[str] = set()
        self._loop = LoopTask("ejection", self._run)
        datastore.on_change(self._forget_gone)

    # -- signals (synchronous: called from the request path and the scraper) -------------
    def failure(self, address: str, reason: str) -> None:
        member = self._datastore.member(address)
        if not self.policy.eject_after or member is None or member.status is not Status.ACTIVE:
            return  # off; or ejected ones are judged by their probes only
        record = self._records.setdefault(address, _Record())
        record.failures += 1
        if record.failures >= self.policy.eject_after:
            self._eject(address, record, reason)

    def success(self, address: str) -> None:
        record = self._records.get(address)
        member = self._datastore.member(address)
        if record is not None and member is not None and member.status is Status.ACTIVE:
            del self._records[address]

    def state(self, address: str) -> tuple[int, float | None]:
        """(consecutive failures, seconds until the next probe if ejected)."""
        record = self._records.get(address)
        if record is None:
            return 0, None
        member = self._datastore.member(address)
        if member is None or member.status is not Status.EJECTED:
            return record.failures, None
        return record.failures, max(record.until - self._clock(), 0.0)

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
        if p.max_failures and record.failures >= p.max_failures and not p.keep_ejected:
            log.warning(
                "endpoint %s failed %d times in a row (last: %s); removing it",
                address,
                record.failures,
                reason,
            )
            self._records.pop(address, None)
            self._datastore.remove(address)
            return
        record.ejections += 1
        backoff = p.backoff(record.ejections)
        record.until = self._clock() + backoff
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
        for address in list(self._records):
            if self._datastore.member(address) is None:
                del self._records[address]
