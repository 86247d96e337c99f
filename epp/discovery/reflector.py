"""List, then watch from the list's resourceVersion, forever: one kind of Kubernetes object.

The loop every Kubernetes controller runs, over ``kubernetes-asyncio``'s generated list
functions and its :class:`~kubernetes_asyncio.watch.Watch`:

* a watch that ends (its server-side timeout, or the connection dropping) resumes from
  the last resourceVersion seen, so nothing is listed again and nothing is missed;
* ``410 Gone`` (the version was compacted away) means events were lost: list again;
* any other API or connection error waits an exponential backoff, then retries.

Objects are handed on as the API's JSON (dicts), never as generated model classes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.watch import Watch

log = logging.getLogger(__name__)

Obj = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class WatchTiming:
    # Each watch asks the server to end it after this long; then it resumes at once.
    # Bounded watches also notice a silently dead connection.
    watch_timeout_s: float = 300.0
    list_timeout_s: float = 60.0
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 30.0


class Backoff:
    """Exponential delays with jitter (so many EPP replicas do not retry in step)."""

    def __init__(
        self, initial: float, maximum: float, rng: Callable[[], float] = random.random
    ) -> None:
        self._initial = initial
        self._maximum = maximum
        self._rng = rng
        self._next = initial

    def delay(self) -> float:
        """The next wait: between half and all of the current step, which then doubles."""
        step = self._next
        self._next = min(step * 2, self._maximum)
        return step * (0.5 + 0.5 * self._rng())

    def reset(self) -> None:
        self._next = self._initial


class Reflector:
    """Keeps a consumer in sync with the objects ``list_fn`` returns.

    ``on_sync(items)`` gets the complete current set after every (re)list: the consumer
    replaces what it had. ``on_event(type, obj)`` gets each ADDED / MODIFIED / DELETED.
    """

    def __init__(
        self,
        what: str,
        list_fn: Callable[..., Awaitable[Any]],
        kwargs: Mapping[str, Any],
        on_sync: Callable[[list[Obj]], Awaitable[None]],
        on_event: Callable[[str, Obj], Awaitable[None]],
        timing: WatchTiming,
    ) -> None:
        self.what = what
        self._list_fn = list_fn
        self._kwargs = dict(kwargs)
        self._on_sync = on_sync
        self._on_event = on_event
        self._timing = timing
        self._backoff = Backoff(timing.backoff_initial_s, timing.backoff_max_s)
        # The newest resourceVersion applied; None: list (again) before watching.
        self._version: str | None = None
        self._just_listed = False  # listed, and no watch event since

    async def run(self) -> None:
        while True:
            try:
                if self._version is None:
                    await self._list()
                await self._watch()
            except ApiException as exc:
                if exc.status == 410:
                    log.info(
                        "%s: resourceVersion %s expired (410 Gone); listing again",
                        self.what,
                        self._version,
                    )
                    self._version = None
                    if self._just_listed:  # 410 again with nothing in between: no tight loop
                        await self._retry_later("410 Gone right after a fresh list")
                    continue
                hint = " (RBAC: the EPP needs get/list/watch on it)" if exc.status == 403 else ""
                await self._retry_later(f"API error {exc.status} {exc.reason}{hint}")
            except (aiohttp.ClientError, TimeoutError, ValueError, KeyError) as exc:
                await self._retry_later(f"{type(exc).__name__}: {exc}")
            except Exception:  # a bug must not end discovery silently: say so, carry on
                log.exception("%s: unexpected error", self.what)
                await self._retry_later("unexpected error (traceback above)")

    async def _retry_later(self, problem: str) -> None:
        delay = self._backoff.delay()
        version = self._version
        then = "listing again" if version is None else f"watching from {version}"
        log.warning("%s: %s; %s in %.1fs", self.what, problem, then, delay)
        await asyncio.sleep(delay)

    async def _list(self) -> None:
        response = await self._list_fn(
            **self._kwargs,
            _preload_content=False,
            _request_timeout=aiohttp.ClientTimeout(total=self._timing.list_timeout_s),
        )
        try:
            body = await response.read()
            if response.status != 200:
                raise ApiException(status=response.status, reason=_status_text(body))
        finally:
            response.release()
        data = _json(body)
        items: list[Obj] = data.get("items") or []
        version = str(data["metadata"]["resourceVersion"])
        log.debug("%s: listed %d at resourceVersion %s", self.what, len(items), version)
        await self._on_sync(items)
        self._version = version
        self._just_listed = True
        self._backoff.reset()

    async def _watch(self) -> None:
        """Watch from the newest version applied until the stream ends."""
        timeout = self._timing.watch_timeout_s
        started = asyncio.get_running_loop().time()
        events = 0
        watch = Watch(return_type="object")  # keep events as JSON dicts
        stream = watch.stream(
            self._list_fn,
            **self._kwargs,
            resource_version=self._version,
            allow_watch_bookmarks=True,
            timeout_seconds=max(1, round(timeout)),
            # a client-side bound too, in case the connection dies without a word
            _request_timeout=aiohttp.ClientTimeout(sock_read=timeout + 30),
        )
        async with watch:
            async for event in stream:
                if not isinstance(event, dict):  # the client passes non-JSON lines on as text
                    raise ValueError(f"watch sent something that is not an event: {event!r:.200}")
                kind, obj = event["type"], event["raw_object"]
                if kind != "BOOKMARK":
                    await self._on_event(kind, obj)
                self._version = str(obj["metadata"]["resourceVersion"])
                self._just_listed = False
                self._backoff.reset()
                events += 1
        if not events and asyncio.get_running_loop().time() - started < timeout / 2:
            # Ended long before its timeout having said nothing (a proxy cutting streams?):
            # wait before the next one rather than reconnecting in a tight loop.
            await self._retry_later("watch ended early without an event")


def _json(body: bytes) -> dict[str, Any]:
    data = json.loads(body)
    if not isinstance(data, dict) or "metadata" not in data:
        raise ValueError(f"list response is not a Kubernetes list: {body[:200]!r}")
    return data


def _status_text(body: bytes) -> str:
    """``reason: message`` of a Kubernetes Status body, else the body itself."""
    try:
        status = json.loads(body)
        return f"{status['reason']}: {status['message']}"
    except (ValueError, KeyError, TypeError):
        return body[:200].decode(errors="replace")
