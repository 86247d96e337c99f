"""LoRA adapters on the model servers: what each one holds, learned from the servers
themselves, and (with ``loraPlacement.enabled``) loading a catalogued adapter on demand
through their own API (vLLM's ``POST /v1/load_lora_adapter`` and
``/v1/unload_lora_adapter``).

Every server is listed (``GET /v1/models``: the cards with a ``parent`` are its
adapters) when it joins the pool and every ``listIntervalSeconds``; a server that no
longer lists an adapter loses it (epp.lora.holdings). A request whose model some server
lists, or that names an adapter of the catalogue (``models.adapters``), is picked only
among the servers that have it (:meth:`AdapterPlacement.holders`): those listing it or
where the EPP loaded it, and, for a server not listed yet, those reporting it running or
waiting. When none has it and placement is on, the request waits while the adapter is
loaded on the best server (decode-capable; fewest adapters the EPP knows there, then
least load; with ``unloadLeastRecentlyUsed`` a server already holding
``maxAdaptersPerServer`` first unloads the adapter the EPP routed to least recently, a
server with room ranking first). Concurrent requests for the same adapter wait for the
same load. A response that says a server lacks the adapter (a 404, or Envoy answering
from the next server of the list) drops it there and lists that server again at once;
so does a server that restarted (a new process start time in its ``/metrics``), which
lost every adapter loaded at runtime, for all of its adapters.

The admin API lists, loads and unloads by hand (epp.lora.admin). Metrics:
``epp_lora_adapter_loads_total``, ``epp_lora_adapter_unloads_total``,
``epp_lora_requests_waited_for_load_total``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from epp.common.looptask import LoopTask
from epp.common.sections import setting
from epp.datastore import Datastore
from epp.errors import ClientVisibleError, NoEndpointError
from epp.lora.holdings import Holdings, doubted, listed_adapters
from epp.observability.metrics import EppMetrics
from epp.types import EndpointMetrics, EndpointState, Role

log = logging.getLogger(__name__)

LOAD_PATH = "/v1/load_lora_adapter"
UNLOAD_PATH = "/v1/unload_lora_adapter"
MODELS_PATH = "/v1/models"


@dataclass(frozen=True)
class PlacementConfig:
    """LoRA adapters: what each server holds (always listed); loading on demand (off)."""

    enabled: bool = setting(
        False,
        "enabled",
        "when a request names an adapter of models.adapters that no server has, load it "
        "on the best server through its /v1/load_lora_adapter first",
    )
    unload_lru: bool = setting(
        False,
        "unloadLeastRecentlyUsed",
        "a server holding maxAdaptersPerServer adapters unloads its least recently used "
        "one before it takes another",
    )
    max_adapters: int = setting(
        2,
        "maxAdaptersPerServer",
        "adapters a server holds before it counts as full (room ranks first; with "
        "unloadLeastRecentlyUsed, the limit is kept)",
        minimum=1,
    )
    timeout_s: float = setting(
        30.0,
        "loadTimeoutSeconds",
        "how long one load, unload or adapter listing may take",
        minimum=0.1,
    )
    list_interval_s: float = setting(
        10.0,
        "listIntervalSeconds",
        "seconds between two listings of every server's adapters (GET /v1/models); "
        "a server is also listed when it joins and after it answers 404 for an adapter "
        "(0: only then)",
        minimum=0.0,
    )


class PlacementError(ClientVisibleError):
    """A server refused or failed a load or unload: its status and message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message, code="lora_placement_failed")
        self.status = status


class AdapterPlacement:
    """What the EPP knows each server holds, the listings that teach it, and the loads
    and unloads it runs."""

    def __init__(
        self,
        cfg: PlacementConfig,
        catalogue: Callable[[], Mapping[str, str]],
        datastore: Datastore,
        metrics: EppMetrics,
    ) -> None:
        self.cfg = cfg
        self._catalogue = catalogue
        self._datastore = datastore
        self._loads = {r: metrics.lora_loads.labels(r) for r in ("ok", "failed")}
        self._unloads = {r: metrics.lora_unloads.labels(r) for r in ("ok", "failed")}
        self._waited = metrics.lora_waited
        self.holdings = Holdings()
        self._loading: dict[str, asyncio.Future[str]] = {}
        self._listings: dict[str, asyncio.Task[None]] = {}  # address -> its listing
        self._active: frozenset[str] = frozenset()  # the pool as last seen
        self._started_at: dict[str, float] = {}  # address -> its process's start time
        self._loop = LoopTask("lora-listing", self._list_periodically)
        self._started = False
        self._session: aiohttp.ClientSession | None = None
        datastore.on_change(self._pool_changed)
        datastore.on_metrics(self._reported)

    # -- the request path ---------------------------------------------------------------

    def lists(self, model: str) -> bool:
        """Whether some server lists ``model`` as an adapter (one dict lookup)."""
        return self.holdings.lists(model)

    def holders(self, adapter: str) -> frozenset[str]:
        """Addresses of healthy servers that have ``adapter`` (Holdings.holders)."""
        return self.holdings.holders(adapter, self._datastore.snapshot().endpoints)

    def routed(self, adapter: str, address: str) -> None:
        """A request for ``adapter`` went to ``address`` (least-recently-used order)."""
        self.holdings.touch(address, adapter)

    def answered(self, adapter: str, primary: str, status: int, served: str) -> None:
        """The response to a request for ``adapter`` sent to ``primary`` (``served``:
        the server that answered, when Envoy says): a server it casts doubt on loses
        the adapter until it lists it again, which it is asked for at once (once
        started)."""
        for address in doubted(primary, status, served):
            if self.holdings.remove(address, adapter):
                log.info("%s may not hold LoRA adapter %s (HTTP %d): listing it", address,
                         adapter, status)  # fmt: skip
                if self._started:
                    self._list_soon(address)

    def _reported(self, address: str, metrics: EndpointMetrics) -> None:
        """A load report (every scrape): a server whose process started again since
        the last one lost the adapters loaded at runtime (its ``--lora-modules`` come
        back with it). What it held is forgotten, so until its listing, which is asked
        for at once, it holds what it reports running or waiting, as a new server."""
        started = metrics.started_at
        if started is None:
            return
        before = self._started_at.get(address)
        self._started_at[address] = started
        if before is None or before == started:
            return
        if self.holdings.knows(address):
            log.info("%s restarted: its LoRA adapters are in doubt until it is listed again",
                     address)  # fmt: skip
            self.holdings.forget(address)
        if self._started:
            self._list_soon(address)

    async def ensure(self, adapter: str) -> frozenset[str]:
        """Servers holding ``adapter``, loading it first where none does (the request
        waits meanwhile); NoEndpointError (503) if it cannot be loaded."""
        await self._list_unknown()
        found = self.holders(adapter)
        if found:
            return found
        self._waited.inc()
        pending = self._loading.get(adapter)
        if pending is None:
            pending = asyncio.ensure_future(self._load_on_best(adapter))
            self._loading[adapter] = pending
            pending.add_done_callback(lambda _: self._loading.pop(adapter, None))
        try:
            address = await asyncio.shield(pending)
        except ClientVisibleError as exc:
            raise NoEndpointError(
                f"LoRA adapter {adapter!r} could not be loaded: {exc.message}",
                code="lora_load_failed",
            ) from None
        return frozenset({address})

    async def _load_on_best(self, adapter: str) -> str:
        endpoints = self._datastore.snapshot().endpoints
        candidates = [s for s in endpoints if s.endpoint.role is not Role.PREFILL]
        if not candidates:
            raise PlacementError(503, "no decode-capable server in the pool")
        best = min(candidates, key=self._rank)
        if self.cfg.unload_lru:
            while len(held := self.holdings.held(best.address)) >= self.cfg.max_adapters:
                await self.unload(held[0], best.address)
        await self.load(adapter, best.address)
        return best.address

    def _rank(self, s: EndpointState) -> tuple[int, float, int]:
        held = len(self.holdings.held(s.address))
        m = s.metrics
        load = float(self._datastore.in_flight(s.address))
        if m is not None:
            load = max(load, (m.waiting or 0.0) + (m.running or 0.0))
        return (held >= self.cfg.max_adapters, load, held)

    # -- listings -----------------------------------------------------------------------

    def start(self) -> None:
        """List every server now, then every ``listIntervalSeconds``, and each server
        that joins the pool as it joins."""
        self._started = True
        self._pool_changed()
        self._loop.start()

    async def _list_periodically(self) -> None:
        while True:  # (a server slow to answer delays only its own next listing)
            for s in self._datastore.snapshot().endpoints:
                self._list_soon(s.address)
            if not self.cfg.list_interval_s:
                return
            await asyncio.sleep(self.cfg.list_interval_s)

    def _pool_changed(self) -> None:
        """Membership or status changed: list the servers that (re)joined the active
        pool, forget those that left it."""
        active = frozenset(s.address for s in self._datastore.snapshot().endpoints)
        joined, self._active = active - self._active, active
        for address in [a for a in self.holdings.listing() if self._datastore.member(a) is None]:
            self.holdings.forget(address)
        for address in [a for a in self._started_at if self._datastore.member(a) is None]:
            del self._started_at[address]
        if self._started:
            for address in joined:
                self._list_soon(address)

    def _list_soon(self, address: str) -> asyncio.Task[None]:
        """``address``'s listing: the one under way, else a new one. (A listing that
        has ended may still be in the table until its done callback runs: a doubt
        cast right then needs a new one.)"""
        task = self._listings.get(address)
        if task is None or task.done():
            task = asyncio.get_running_loop().create_task(self._list(address))
            self._listings[address] = task
            task.add_done_callback(lambda t: self._forget_listing(address, t))
        return task

    def _forget_listing(self, address: str, task: asyncio.Task[None]) -> None:
        if self._listings.get(address) is task:  # not a newer one that replaced it
            del self._listings[address]

    async def _list_unknown(self) -> None:
        """Wait for the listings of the servers never listed (placement needs them)."""
        endpoints = self._datastore.snapshot().endpoints
        new = [self._list_soon(s.address) for s in endpoints if not self.holdings.knows(s.address)]
        if new:
            await asyncio.gather(*new, return_exceptions=True)

    # -- the servers' API (also the admin API's) ----------------------------------------

    async def load(self, adapter: str, address: str) -> None:
        """Load ``adapter`` (from the catalogue's path) on ``address``; PlacementError
        with the server's status and message if it refuses."""
        path = self._catalogue().get(adapter)
        if path is None:
            raise PlacementError(404, f"LoRA adapter {adapter!r} is not in models.adapters")
        body = {"lora_name": adapter, "lora_path": path}
        status, text = await self._post(address, LOAD_PATH, body)
        if status != 200 and "already been loaded" not in text:
            self._loads["failed"].inc()
            raise PlacementError(status if status >= 400 else 502, f"{address}: {text}")
        self._loads["ok"].inc()
        self.holdings.add(address, adapter)
        log.info("loaded LoRA adapter %s on %s", adapter, address)

    async def unload(self, adapter: str, address: str) -> None:
        status, text = await self._post(address, UNLOAD_PATH, {"lora_name": adapter})
        if status != 200 and status != 404:  # 404: it was not there (any more)
            self._unloads["failed"].inc()
            raise PlacementError(status if status >= 400 else 502, f"{address}: {text}")
        self._unloads["ok"].inc()
        self.holdings.remove(address, adapter)
        log.info("unloaded LoRA adapter %s from %s", adapter, address)

    def listing(self) -> dict[str, list[str]]:
        """address -> adapters the EPP knows it holds (least recently used first)."""
        return self.holdings.listing()

    async def _list(self, address: str) -> None:
        """Ask ``address`` what it holds (its ``/v1/models``); on failure what was known
        stays, and it is asked again next time."""
        try:
            async with asyncio.timeout(self.cfg.timeout_s):
                async with self._client().get(f"http://{address}{MODELS_PATH}") as resp:
                    body = await resp.read()
                    if resp.status != 200:
                        raise ValueError(f"HTTP {resp.status}: {_message(body)}")
            held = listed_adapters(orjson.loads(body))
        except (TimeoutError, aiohttp.ClientError, OSError, ValueError) as exc:
            level = logging.DEBUG if self.holdings.knows(address) else logging.WARNING
            log.log(level, "cannot list the adapters of %s: %s", address,
                    exc or type(exc).__name__)  # fmt: skip
            return
        if self._datastore.member(address) is not None:  # (not gone meanwhile)
            self.holdings.listed(address, held)

    async def _post(self, address: str, path: str, body: Mapping[str, Any]) -> tuple[int, str]:
        try:
            async with asyncio.timeout(self.cfg.timeout_s):
                async with self._client().post(
                    f"http://{address}{path}", data=orjson.dumps(body),
                    headers={"content-type": "application/json"},
                ) as resp:  # fmt: skip
                    return resp.status, _message(await resp.read())
        except TimeoutError:
            return 504, f"no answer to {path} within {self.cfg.timeout_s:g}s"
        except (aiohttp.ClientError, OSError) as exc:
            return 502, f"cannot reach the server: {exc or type(exc).__name__}"

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None), trust_env=False
            )
        return self._session

    async def stop(self) -> None:
        self._started = False  # no new listings
        await self._loop.stop()
        tasks: list[asyncio.Future[Any]] = [*self._loading.values(), *self._listings.values()]
        for pending in tasks:
            pending.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()


def _message(body: bytes) -> str:
    """A server's answer as one line: its error message, or its text."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body.decode(errors="replace").strip()[:300]
    if isinstance(doc, dict):
        error = doc.get("error", doc)
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
    return body.decode(errors="replace").strip()[:300]
