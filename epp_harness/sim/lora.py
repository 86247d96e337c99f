"""LoRA adapters in the simulator, as vLLM serves them.

Adapters are *registered* (``--lora-modules name=path`` at start, or at runtime with
``POST /v1/load_lora_adapter``) and then usable as a request's ``model``; a request for
a name that is neither the base model nor registered gets vLLM's 404 ("The model `x`
does not exist."). Running a request needs its adapter in one of ``max_loras`` GPU
slots. An adapter already in a slot is used at once; a free slot takes it; a full slot
table evicts the least recently used adapter no request is using, and that swap costs
``lora_swap_ms`` (scaled by ``time_scale``). When every slot is busy with other
adapters, the request waits (its adapter is then listed as waiting).

``vllm:lora_requests_info`` is kept as vLLM keeps it: one series per label set
``{max_lora, running_lora_adapters, waiting_lora_adapters}`` (adapters with running /
waiting requests, comma-separated), whose value is the wall-clock time that state was
last current; old label sets stay on the page with their old timestamps, so a reader
must take the newest series.

Routes (``LoraRoutes``), with vLLM's shapes: ``POST /v1/load_lora_adapter``
``{"lora_name", "lora_path"}`` and ``POST /v1/unload_lora_adapter`` ``{"lora_name"}``
answer 200 with a plain-text ``Success: ...`` line, or an error body (400
``InvalidUserInput`` for missing fields or an adapter already loaded, 404
``NotFoundError`` for unloading one that is not).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, OrderedDict
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable
from contextlib import aclosing
from typing import Any

import orjson
from aiohttp import web

from epp_harness.sim.config import SimConfig
from epp_harness.sim.protocol import SimError
from epp_harness.sim.responses import error_response

LOAD_PATH = "/v1/load_lora_adapter"
UNLOAD_PATH = "/v1/unload_lora_adapter"
INVALID_USER_INPUT = "InvalidUserInput"


def parse_lora_module(text: str) -> tuple[str, str]:
    """``name=path`` (vLLM's --lora-modules form) -> (name, path); ValueError if not."""
    name, sep, path = text.partition("=")
    name, path = name.strip(), path.strip()
    if not sep or not name or not path:
        raise ValueError(f"expected name=path, got {text!r}")
    return name, path


class LoraSlots:
    """Registered adapters, the GPU slot table and who waits for a slot (one loop)."""

    def __init__(
        self,
        max_loras: int,
        modules: Iterable[tuple[str, str]] = (),
        *,
        swap_seconds: float = 0.0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.max_loras = max_loras
        self.swap_seconds = swap_seconds
        self.registered: dict[str, str] = dict(modules)  # name -> path, load order
        self._sleep = sleep
        self._wall = wall_clock
        # adapter -> requests using it; LRU first (the eviction order)
        self._slots: OrderedDict[str, int] = OrderedDict()
        self._swapping: dict[str, asyncio.Future[None]] = {}
        self._waiting: Counter[str] = Counter()
        self._changed: asyncio.Future[None] | None = None
        self.swaps = 0  # adapters that evicted another from a full slot table
        self.loads = 0  # adapters registered through the runtime API
        # label set (running, waiting) -> when it was last current (wall time)
        self._series: dict[tuple[str, str], float] = {}
        self._current = ("", "")
        self._series[self._current] = self._wall()

    # -- registration (the runtime API) ------------------------------------------------

    def load(self, name: str, path: str) -> None:
        if name in self.registered:
            raise SimError(
                400, f"The lora adapter '{name}' has already been loaded.", INVALID_USER_INPUT
            )
        self.registered[name] = path
        self.loads += 1

    def unload(self, name: str) -> None:
        if name not in self.registered:
            raise SimError(404, f"The lora adapter '{name}' cannot be found.", "NotFoundError")
        del self.registered[name]
        if self._slots.get(name) == 0:
            del self._slots[name]
            self._notify()

    # -- slots ---------------------------------------------------------------------------

    @property
    def active(self) -> tuple[str, ...]:
        """Adapters in GPU slots, least recently used first."""
        return tuple(self._slots)

    @property
    def running(self) -> list[str]:
        return [name for name, users in self._slots.items() if users > 0]

    @property
    def waiting(self) -> list[str]:
        return [name for name, count in self._waiting.items() if count > 0]

    @property
    def waiting_requests(self) -> int:
        return sum(self._waiting.values())

    async def hold(self, name: str, tokens: AsyncGenerator[int, None]) -> AsyncGenerator[int, None]:
        """``tokens``, generated once ``name`` has a slot, the slot kept until done."""
        await self._acquire(name)
        try:
            async with aclosing(tokens):
                async for index in tokens:
                    yield index
        finally:
            self._release(name)

    async def _acquire(self, name: str) -> None:
        self._waiting[name] += 1
        self._record()
        try:
            while (evicted := self._try_enter(name)) is None:
                if self._changed is None or self._changed.done():
                    self._changed = asyncio.get_running_loop().create_future()
                await asyncio.shield(self._changed)
        finally:
            self._waiting[name] -= 1
            if not self._waiting[name]:
                del self._waiting[name]
            self._record()
        swap = self._swapping.get(name)
        if swap is not None:
            try:
                await asyncio.shield(swap)
            except asyncio.CancelledError:
                self._release(name)
                raise
            return
        if evicted and self.swap_seconds > 0:
            done = asyncio.get_running_loop().create_future()
            self._swapping[name] = done
            try:
                await self._sleep(self.swap_seconds)
            except asyncio.CancelledError:
                self._release(name)
                raise
            finally:
                del self._swapping[name]
                done.set_result(None)

    def _try_enter(self, name: str) -> bool | None:
        """Take a slot for one request of ``name``: None if none is to be had yet, else
        whether an idle adapter had to be evicted for it (a swap)."""
        slots = self._slots
        if name in slots:
            slots[name] += 1
            slots.move_to_end(name)
            return False
        evicted = len(slots) >= self.max_loras
        if evicted:
            idle = next((a for a, users in slots.items() if users == 0), None)
            if idle is None:
                return None
            del slots[idle]
            self.swaps += 1
        slots[name] = 1
        return evicted

    def _release(self, name: str) -> None:
        users = self._slots[name] - 1
        self._slots[name] = users
        if users == 0 and name not in self.registered:  # unloaded meanwhile
            del self._slots[name]
        self._record()
        if users == 0:
            self._notify()

    def _notify(self) -> None:
        if self._changed is not None and not self._changed.done():
            self._changed.set_result(None)

    # -- vllm:lora_requests_info ---------------------------------------------------------

    def _record(self) -> None:
        state = (",".join(self.running), ",".join(self.waiting))
        if state != self._current:
            now = self._wall()
            self._series[self._current] = now
            self._current = state
            self._series[state] = now

    def info_series(self) -> list[tuple[str, str, float]]:
        """(running, waiting, timestamp) of every label set seen; the current one is
        stamped now, as vLLM restamps it on every engine step."""
        self._series[self._current] = self._wall()
        return [(run, wait, at) for (run, wait), at in self._series.items()]


def lora_slots(config: SimConfig) -> LoraSlots | None:
    """The instance's adapter slots; None unless LoRA is enabled."""
    if not config.enable_lora:
        return None
    swap_seconds = config.lora_swap_ms * config.time_scale / 1000.0
    return LoraSlots(config.max_loras, config.lora_modules, swap_seconds=swap_seconds)


def _model_card(name: str, path: str, parent: str, created: int) -> dict[str, Any]:
    return {
        "id": name,
        "object": "model",
        "created": created,
        "owned_by": "vllm",
        "root": path,
        "parent": parent,
        "max_model_len": None,
    }


def adapter_cards(slots: LoraSlots, base_model: str, created: int) -> list[dict[str, Any]]:
    """``/v1/models`` entries of the registered adapters (vLLM lists them after the base
    model, with the adapter's path as ``root`` and the base model as ``parent``)."""
    return [_model_card(n, p, base_model, created) for n, p in slots.registered.items()]


async def _json_object(request: web.Request) -> dict[str, Any]:
    try:
        doc = orjson.loads(await request.read())
    except orjson.JSONDecodeError as exc:
        raise SimError(400, f"Invalid JSON body: {exc}") from None
    if not isinstance(doc, dict):
        raise SimError(400, "The request body must be a JSON object")
    return doc


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


class LoraRoutes:
    """vLLM's runtime adapter API over one LoraSlots."""

    def __init__(self, slots: LoraSlots) -> None:
        self.slots = slots

    async def load(self, request: web.Request) -> web.Response:
        try:
            doc = await _json_object(request)
            name, path = _text(doc.get("lora_name")), _text(doc.get("lora_path"))
            if not name or not path:
                raise SimError(
                    400, "Both 'lora_name' and 'lora_path' must be provided.", INVALID_USER_INPUT
                )
            self.slots.load(name, path)
        except SimError as exc:
            return error_response(exc)
        return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")

    async def unload(self, request: web.Request) -> web.Response:
        try:
            doc = await _json_object(request)
            name = _text(doc.get("lora_name"))
            if not name and doc.get("lora_int_id") is None:
                raise SimError(
                    400,
                    "either 'lora_name' and 'lora_int_id' needs to be provided.",
                    INVALID_USER_INPUT,
                )
            self.slots.unload(name)
        except SimError as exc:
            return error_response(exc)
        return web.Response(text=f"Success: LoRA adapter '{name}' removed successfully.")

    def add_to(self, app: web.Application) -> None:
        app.router.add_post(LOAD_PATH, self.load)
        app.router.add_post(UNLOAD_PATH, self.unload)
