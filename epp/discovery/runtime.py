"""Instances added and removed at runtime (the admin API), with a readiness wait.

An added instance is checked at once; if it is not ready it is listed as ``waiting``
and re-checked every ``retry_interval_s`` up to ``max_retries`` times, joining the pool
on the first success and leaving the list when the retries run out. With a state file,
the runtime-added instances that are still members are saved after every change and
re-added (with the same readiness wait) when the EPP starts again. An instance given by
host name joins under the address the name resolves to, and is followed by the
:class:`~epp.discovery.names.NameResolver` (its state-file entry keeps the name).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from epp.common import addresses, statefile
from epp.datastore import Datastore, Status
from epp.discovery.names import NameResolver, ResolveError
from epp.types import Endpoint

log = logging.getLogger(__name__)

Check = Callable[[str], Awaitable[str | None]]


class Outcome(StrEnum):
    ADDED = "added"
    UPDATED = "updated"  # already a member; its role changed
    EXISTS = "already exists"
    WAITING = "waiting to start"
    REMOVED = "removed"
    DRAINING = "draining"
    NOT_FOUND = "not in the list"
    WITHDRAWN = "removed while being verified"


@dataclass(frozen=True)
class WaitPolicy:
    retry_interval_s: float = 10.0
    max_retries: int = 3


class RuntimeMembership:
    def __init__(
        self,
        datastore: Datastore,
        check: Check,
        policy: WaitPolicy,
        *,
        state_file: Path | None = None,
        engine: str = "vllm",
        resolver: NameResolver | None = None,
    ) -> None:
        self._datastore = datastore
        self._resolver = resolver if resolver is not None else NameResolver(datastore)
        self._resolver.on_move(self._moved)
        self._check = check
        self.policy = policy
        self._state_file = state_file
        self._engine = engine
        self._waiters: dict[str, asyncio.Task[None]] = {}
        self._checking: set[str] = set()
        # bumped by every remove: a check or wait that began before it must not add back
        self._generation: dict[str, int] = {}
        # runtime-added endpoints, persisted; pruned when they leave the datastore
        self._runtime: dict[str, Endpoint] = {}
        datastore.on_change(self._prune)

    async def start(self) -> None:
        """As a discovery source: re-add what the state file lists."""
        await self.restore()

    async def restore(self) -> list[tuple[str, Outcome]]:
        """Re-add what the state file lists (a missing file is an empty list; a corrupt
        one is reported and ignored)."""
        if self._state_file is None:
            return []
        endpoints = statefile.load(self._state_file, self._engine)
        if endpoints:
            log.info("state file %s: re-adding %d instance(s)", self._state_file, len(endpoints))
        outcomes = []
        for endpoint in endpoints:
            try:
                outcomes.append((endpoint.address, await self.add(endpoint)))
            except ResolveError as exc:
                log.error("state file %s: %s; not re-added", self._state_file, exc)
        return outcomes

    async def add(self, endpoint: Endpoint) -> Outcome:
        """Add (or re-check) ``endpoint``; a host name is resolved first (ResolveError
        if it does not resolve)."""
        if not addresses.is_ip(endpoint.host):
            endpoint = await self._resolver.resolve(endpoint)
        outcome = await self._add(endpoint)
        if outcome in (Outcome.ADDED, Outcome.UPDATED, Outcome.WAITING):
            self._resolver.follow(endpoint)
        return outcome

    async def _add(self, endpoint: Endpoint) -> Outcome:
        address = endpoint.address
        member = self._datastore.member(address)
        if member is not None and member.status is not Status.DRAINING:
            if member.status is Status.WAITING:
                return Outcome.WAITING
            if member.endpoint.role is endpoint.role:
                return Outcome.EXISTS
            self._datastore.add(endpoint)
            self._remember(endpoint)
            return Outcome.UPDATED
        if address in self._checking:
            return Outcome.WAITING  # a concurrent add is checking it
        log.info("verifying %s ...", address)
        self._checking.add(address)
        generation = self._generation.get(address, 0)
        try:
            reason = await self._check(address)
        finally:
            self._checking.discard(address)
        if self._generation.get(address, 0) != generation:  # removed while we checked
            log.info("instance %s was removed while being verified; not added", address)
            return Outcome.WITHDRAWN
        self._remember(endpoint)
        if reason is None:
            self._datastore.add(endpoint)
            log.info("instance %s is ready; added as %s", address, endpoint.role.value)
            return Outcome.ADDED
        log.info("instance %s not ready (%s); waiting for it to start", address, reason)
        self._datastore.add(endpoint, waiting=True)
        self._waiters[address] = asyncio.get_running_loop().create_task(
            self._wait(endpoint), name=f"wait:{address}"
        )
        return Outcome.WAITING

    def remove(self, address: str) -> Outcome:
        # whatever is still checking or waiting for this address is now stale
        self._generation[address] = self._generation.get(address, 0) + 1
        waiter = self._waiters.pop(address, None)
        if waiter is not None:
            waiter.cancel()
        member = self._datastore.member(address)
        if member is None:
            return Outcome.NOT_FOUND
        self._runtime.pop(address, None)
        self._datastore.remove(address)
        left = self._datastore.member(address)
        self._save()
        return Outcome.DRAINING if left is not None else Outcome.REMOVED

    async def stop(self) -> None:
        tasks = list(self._waiters.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _wait(self, endpoint: Endpoint) -> None:
        address = endpoint.address
        generation = self._generation.get(address, 0)

        def still_wanted() -> bool:
            member = self._datastore.member(address)
            return (
                self._generation.get(address, 0) == generation
                and member is not None
                and member.status is Status.WAITING
            )

        try:
            for attempt in range(1, self.policy.max_retries + 1):
                await asyncio.sleep(self.policy.retry_interval_s)
                if not still_wanted():
                    return  # removed (or added by another source) meanwhile
                log.info(
                    "verifying %s (attempt %d/%d) ...", address, attempt, self.policy.max_retries
                )
                reason = await self._check(address)
                if not still_wanted():
                    return
                if reason is None:
                    self._datastore.add(endpoint)
                    log.info("instance %s is ready; added as %s", address, endpoint.role.value)
                    return
                log.info("instance %s still not ready: %s", address, reason)
            log.warning(
                "instance %s did not become ready after %d check(s) %gs apart; dropped",
                address,
                self.policy.max_retries,
                self.policy.retry_interval_s,
            )
            if still_wanted():
                self._datastore.remove(address)
        finally:
            if self._waiters.get(address) is asyncio.current_task():
                del self._waiters[address]

    def _moved(self, old: str, new: Endpoint) -> None:
        """A followed name now resolves elsewhere: keep the new address instead."""
        if self._runtime.pop(old, None) is not None:
            self._runtime[new.address] = new
            self._save()

    def _remember(self, endpoint: Endpoint) -> None:
        self._runtime[endpoint.address] = endpoint
        self._save()

    def _prune(self) -> None:
        gone = [a for a in self._runtime if self._datastore.member(a) is None]
        for address in gone:
            del self._runtime[address]
        if gone:
            self._save()

    def _save(self) -> None:
        if self._state_file is not None:
            statefile.save(self._state_file, list(self._runtime.values()))
