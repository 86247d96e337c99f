"""LoRA adapter placement: load a catalogued adapter on demand, through the model
servers' own API (vLLM's ``POST /v1/load_lora_adapter`` and ``/v1/unload_lora_adapter``).

When a request names an adapter of the catalogue (``models.adapters``), the router asks
:meth:`AdapterPlacement.holders` which servers have it: those the EPP saw listing it in
``GET /v1/models`` or loaded it on, and those reporting it running or waiting. The
request is then picked among them only. When none has it, the request waits while the
adapter is loaded on the best server (decode-capable; fewest adapters the EPP knows there,
then least load; with ``unloadLeastRecentlyUsed`` a server already holding
``maxAdaptersPerServer`` first unloads the adapter the EPP routed to least recently, a
server with room ranking first). Concurrent requests for the same adapter wait for the
same load. A server is listed (``/v1/models``) the first time placement needs it.

Off by default (``loraPlacement.enabled``). The admin API lists, loads and unloads by
hand (epp.admin.lora). Metrics: ``epp_lora_adapter_loads_total``,
``epp_lora_adapter_unloads_total``, ``epp_lora_requests_waited_for_load_total``.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from epp.datastore import Datastore
from epp.errors import ClientVisibleError, NoEndpointError
from epp.metrics import EppMetrics
from epp.scheduling.sections import setting
from epp.types import EndpointState, Role

log = logging.getLogger(__name__)

LOAD_PATH = "/v1/load_lora_adapter"
UNLOAD_PATH = "/v1/unload_lora_adapter"
MODELS_PATH = "/v1/models"


@dataclass(frozen=True)
class PlacementConfig:
    """LoRA adapter placement: load catalogued adapters on demand (off by default)."""

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


class PlacementError(ClientVisibleError):
    """A server refused or failed a load or unload: its status and message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message, code="lora_placement_failed")
        self.status = status


class AdapterPlacement:
    """What the EPP knows each server holds, and the loads and unloads it runs."""

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
        # address -> adapters it holds, least recently routed to first
        self._held: dict[str, OrderedDict[str, None]] = {}
        self._loading: dict[str, asyncio.Future[str]] = {}
        self._session: aiohttp.ClientSession | None = None

    # -- the request path ---------------------------------------------------------------

    def holders(self, adapter: str) -> frozenset[str]:
        """Addresses of healthy servers that have ``adapter``: listed there or loaded
        there by the EPP; for a server not listed yet, reported running or waiting."""
        out = set()
        for s in self._datastore.snapshot().endpoints:
            held = self._held.get(s.address)
            if held is not None:  # listed: what the EPP knows beats a report that may lag
                if adapter in held:
                    out.add(s.address)
                continue
            m = s.metrics
            if m is not None and (adapter in m.lora_running or adapter in m.lora_waiting):
                out.add(s.address)
        return frozenset(out)

    def routed(self, adapter: str, address: str) -> None:
        """A request for ``adapter`` went to ``address`` (least-recently-used order)."""
        held = self._held.get(address)
        if held is not None and adapter in held:
            held.move_to_end(adapter)

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
        held = self._held.setdefault(best.address, OrderedDict())
        if self.cfg.unload_lru:
            while len(held) >= self.cfg.max_adapters:
                await self.unload(next(iter(held)), best.address)
        await self.load(adapter, best.address)
        return best.address

    def _rank(self, s: EndpointState) -> tuple[int, float, int]:
        held = len(self._held.get(s.address, ()))
        m = s.metrics
        load = float(self._datastore.in_flight(s.address))
        if m is not None:
            load = max(load, (m.waiting or 0.0) + (m.running or 0.0))
        return (held >= self.cfg.max_adapters, load, held)

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
        self._held.setdefault(address, OrderedDict())[adapter] = None
        log.info("loaded LoRA adapter %s on %s", adapter, address)

    async def unload(self, adapter: str, address: str) -> None:
        status, text = await self._post(address, UNLOAD_PATH, {"lora_name": adapter})
        held = self._held.get(address)
        if status != 200 and status != 404:  # 404: it was not there (any more)
            self._unloads["failed"].inc()
            raise PlacementError(status if status >= 400 else 502, f"{address}: {text}")
        self._unloads["ok"].inc()
        if held is not None:
            held.pop(adapter, None)
        log.info("unloaded LoRA adapter %s from %s", adapter, address)

    def listing(self) -> dict[str, list[str]]:
        """address -> adapters the EPP knows it holds (least recently used first)."""
        return {a: list(held) for a, held in self._held.items()}

    async def _list_unknown(self) -> None:
        """List the adapters of servers never listed (their /v1/models)."""
        endpoints = self._datastore.snapshot().endpoints
        new = [s.address for s in endpoints if s.address not in self._held]
        if new:
            await asyncio.gather(*(self._list(a) for a in new))

    async def _list(self, address: str) -> None:
        try:
            async with asyncio.timeout(self.cfg.timeout_s):
                async with self._client().get(f"http://{address}{MODELS_PATH}") as resp:
                    body = await resp.read()
            held = _adapters(orjson.loads(body))
        except (TimeoutError, aiohttp.ClientError, OSError, ValueError) as exc:
            log.warning("cannot list the adapters of %s: %s", address, exc or type(exc).__name__)
            return  # asked again next time
        self._held.setdefault(address, OrderedDict()).update(dict.fromkeys(held))

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
        for pending in list(self._loading.values()):
            pending.cancel()
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()


def _adapters(doc: Any) -> Iterable[str]:
    """The adapter ids of a ``/v1/models`` answer: cards with a ``parent``."""
    return [
        card["id"]
        for card in doc["data"]
        if isinstance(card, dict) and card.get("parent") and isinstance(card.get("id"), str)
    ]


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
