"""The simulator's HTTP surface: an aiohttp app serving vLLM's API plus test hooks.

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions``, ``GET /v1/models``,
the other request APIs vLLM and SGLang serve (epp_harness.sim.apis: ``/v1/messages``,
``/v1/messages/count_tokens``, ``/v1/responses``, ``/v1/embeddings``,
``/inference/v1/generate``, ``/generate``),
with ``--enable-lora`` ``POST /v1/load_lora_adapter`` and ``/v1/unload_lora_adapter``
(epp_harness.sim.lora),
``GET /health``, ``GET /metrics``, ``POST /tokenize``, ``POST /reset_prefix_cache``,
for tests ``GET /sim/stats``,
``GET /sim/last-request`` and ``POST /sim/faults``, and for P/D handoffs between
instances ``POST /sim/kv/pull`` and ``POST /sim/bootstrap/join`` (epp_harness.sim.kv_routes).
Every response carries ``x-sim-instance: <instance id>``.

Every generation route goes through ``SimServer.generate``: the one place where a request
is read, recorded, parsed, planned (the KV handoff, epp_harness.sim.handoff) and run.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import ExitStack, aclosing
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web
from multidict import CIMultiDictProxy

from epp_harness.sim import apis, orca, responses
from epp_harness.sim.config import SimConfig
from epp_harness.sim.engine import Engine, PromptReport
from epp_harness.sim.faults import (
    FAULT_MESSAGE,
    Faults,
    MetricsFault,
    parse_fault_metrics,
    parse_fault_status,
)
from epp_harness.sim.handoff import Plan, SimHandoff
from epp_harness.sim.kv_routes import KvRoutes
from epp_harness.sim.lora import LoraRoutes, adapter_cards, lora_slots
from epp_harness.sim.metrics import METRICS_CONTENT_TYPE, SimMetrics
from epp_harness.sim.protocol import (
    MAX_TOKENS_LIMIT,
    ApiKind,
    GenerationRequest,
    SimError,
    load_object,
    parse_doc,
)
from epp_harness.sim.responses import error_response, json_response
from epp_harness.sim.tokenizer import tokenize_body, tokenized

if TYPE_CHECKING:
    from epp_harness.sim.kv_events import KvEventPublisher

log = logging.getLogger(__name__)

INSTANCE_HEADER = "x-sim-instance"
# Far above aiohttp's 1 MiB default: routers must be testable with large prompts.
MAX_BODY_BYTES = 256 * 1024 * 1024


@dataclasses.dataclass(slots=True)
class LastRequest:
    """The most recent POST to /v1/*, kept as received; digest and JSON built on demand."""

    path: str
    headers: CIMultiDictProxy[str]
    body: bytes
    _sha256: str | None = dataclasses.field(default=None, init=False)

    def to_json(self) -> dict[str, Any]:
        if self._sha256 is None:
            # Hashed only when asked: the overhead benchmarks never ask.
            self._sha256 = hashlib.sha256(self.body).hexdigest()
        headers: dict[str, str] = {}
        for name, value in self.headers.items():
            key = name.lower()
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        try:
            body: Any = orjson.loads(self.body)
        except orjson.JSONDecodeError:
            body = None
        return {
            "path": self.path,
            "headers": headers,
            "body": body,  # the parsed JSON body; null when it is not JSON
            "body_bytes": len(self.body),
            "body_sha256": self._sha256,
        }


class SimServer:
    """Request handlers around one Engine; create with ``make_app``."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.metrics = SimMetrics(config.model, config.metrics_dialect)
        # KV events: bound by `epp sim` (cli), which starts it once the loop runs
        self.kv_events: KvEventPublisher | None = None
        if config.kv_events_port is not None:
            # imported here: ZeroMQ and msgspec, which a simulator without KV events
            # would load for nothing at every start (docs/testing.md)
            from epp_harness.sim.kv_events import KvEventPublisher

            self.kv_events = KvEventPublisher(config.kv_events_topic)
        self.engine = Engine(
            config, on_first_token=self.metrics.observe_ttft, kv_events=self.kv_events
        )
        self.handoff = SimHandoff(config, self.engine)
        self.lora = lora_slots(config)
        self.metrics.attach(self.engine, self.handoff, self.lora)
        self.last_request: LastRequest | None = None
        # injected faults for tests (epp_harness.sim.faults; --fault-*, /sim/faults)
        self.injected_faults = Faults(config.fault_status, config.fault_metrics, config.fault_seed)

    async def close(self, app: web.Application) -> None:
        await self.handoff.close()

    async def tag_response(self, request: web.Request, response: web.StreamResponse) -> None:
        response.headers[INSTANCE_HEADER] = self.config.instance_id

    def route(self, api: apis.SimApi) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        """The handler of a generation route speaking ``api``."""

        async def handle(request: web.Request) -> web.StreamResponse:
            return await self.generate(request, api)

        return handle

    async def read(
        self, request: web.Request, api: apis.SimApi
    ) -> GenerationRequest | web.Response:
        """Read, record and validate one generation request (the error response if bad)."""
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return api.error(
                SimError(413, f"The request body is larger than {MAX_BODY_BYTES} bytes")
            )
        self.last_request = LastRequest(request.path, request.headers, raw)
        injected = self.injected_faults.draw()
        if injected is not None:
            return api.error(SimError(injected, f"{FAULT_MESSAGE} ({injected})"))
        try:
            kind, doc = api.to_openai(load_object(raw))
            if api.model_optional:
                doc.setdefault("model", self.config.model)
            req = parse_doc(
                kind,
                doc,
                served_model=self.config.model,
                default_max_tokens=self.config.default_max_tokens,
                request_id=request.headers.get("x-request-id"),
                adapters=self.lora.registered if self.lora is not None else (),
            )
        except SimError as exc:
            return api.error(exc)
        if self.kv_events is not None:  # blocks announced carry token ids
            req = tokenized(req)
        return req

    async def count_tokens(self, request: web.Request) -> web.Response:
        """Anthropic's ``POST /v1/messages/count_tokens``: the prompt's tokens."""
        req = await self.read(request, _COUNT_TOKENS)
        if isinstance(req, web.Response):
            return req
        return json_response(apis.count_tokens_body(req))

    async def generate(self, request: web.Request, api: apis.SimApi) -> web.StreamResponse:
        """Read, record, validate and run one generation request."""
        req = await self.read(request, api)
        if isinstance(req, web.Response):
            return req
        # TTFT counts from here: a KV handoff's wait is part of it.
        arrival = self.engine.now()
        with ExitStack() as stack:
            try:
                plan = await self.handoff.prepare(req, stack)
            except SimError as exc:
                return api.error(exc)
            if plan.req.stream:
                return await self._stream(request, plan, arrival, api)
            response = await self._complete(plan, arrival, api)
        # ORCA load header (vLLM: non-streaming responses only)
        orca.add_load_header(
            response.headers, request.headers, self.config.orca_format, self.engine
        )
        return response

    def _tokens(
        self, plan: Plan, arrival: float, report: PromptReport
    ) -> AsyncGenerator[int, None]:
        """The engine's token indexes for ``plan``, running its after-prefill step."""
        tokens = self.engine.generate(
            plan.req, received_tokens=plan.received_tokens, arrival=arrival, report=report
        )
        if plan.after_prefill is not None:
            tokens = _after_first(tokens, plan.after_prefill)
        if self.lora is not None and plan.req.model != self.config.model:
            tokens = self.lora.hold(plan.req.model, tokens)  # an adapter: needs a slot
        return tokens

    def _cached(self, report: PromptReport) -> int | None:
        """``cached_tokens`` for ``usage``: None unless prompt token details are on."""
        return report.cached_tokens if self.config.enable_prompt_tokens_details else None

    async def _complete(self, plan: Plan, arrival: float, api: apis.SimApi) -> web.Response:
        req = plan.req
        rid, created = api.response_id(req), responses.now_created()
        generated = 0
        report = PromptReport()
        async with aclosing(self._tokens(plan, arrival, report)) as tokens:
            async for _ in tokens:
                generated += 1
        body = api.full(req, rid, created, generated, self._cached(report))
        body.update(plan.response_fields)
        return json_response(body)

    async def _stream(
        self, request: web.Request, plan: Plan, arrival: float, api: apis.SimApi
    ) -> web.StreamResponse:
        req = plan.req
        rid, created = api.response_id(req), responses.now_created()
        resp = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream; charset=utf-8",
                "Cache-Control": "no-cache",
            }
        )
        await resp.prepare(request)
        last = req.max_tokens - 1
        generated = 0
        report = PromptReport()
        try:
            # aclosing: a disconnect must free the running slot now, not at GC time.
            async with aclosing(self._tokens(plan, arrival, report)) as tokens:
                async for index in tokens:
                    if index == 0 and (first := api.first(req, rid, created)):
                        # vLLM sends the role delta once the first output exists.
                        await resp.write(first)
                    chunk = api.token(req, rid, created, index, index == last)
                    if chunk:
                        await resp.write(chunk)
                    generated += 1
            await resp.write(api.end(req, rid, created, generated, self._cached(report)))
            await resp.write_eof()
        except ConnectionResetError:
            # The client went away mid-stream: nothing to answer, the slot is already free.
            log.debug("client disconnected from %s after %d tokens", rid, generated)
        return resp

    async def models(self, request: web.Request) -> web.Response:
        created = responses.now_created()
        body = responses.models_list(self.config.model, created, MAX_TOKENS_LIMIT)
        if self.lora is not None:
            body["data"].extend(adapter_cards(self.lora, self.config.model, created))
        return json_response(body)

    async def tokenize(self, request: web.Request) -> web.Response:
        """vLLM's ``POST /tokenize``: the prompt's (or the chat's) token ids."""
        try:
            doc = orjson.loads(await request.read())
            body = tokenize_body(doc, self.config.model, MAX_TOKENS_LIMIT)
        except orjson.JSONDecodeError as exc:
            return error_response(SimError(400, f"Invalid JSON body: {exc}"))
        except SimError as exc:
            return error_response(exc)
        return json_response(body)

    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        """vLLM's ``POST /reset_prefix_cache``: drop every cached block."""
        self.engine.reset_prefix_cache()
        return web.Response(status=200)

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def prometheus(self, request: web.Request) -> web.Response:
        fault = self.injected_faults.metrics
        if fault.fail:
            return web.Response(status=503, text=f"{FAULT_MESSAGE}: /metrics fails\n")
        if fault.delay_s:
            await asyncio.sleep(fault.delay_s)
        return web.Response(
            body=self.metrics.render(), headers={"Content-Type": METRICS_CONTENT_TYPE}
        )

    async def stats(self, request: web.Request) -> web.Response:
        engine, counters, config = self.engine, self.engine.counters, self.config
        return json_response(
            {
                "instance": config.instance_id,
                "model": config.model,
                "role": config.role.value,
                "kv_connector": config.kv_connector.value,
                "engine_id": self.handoff.engine_id,
                "requests_total": counters.requests_total,
                "running": engine.running,
                "waiting": engine.waiting,
                "kv_blocks_used": engine.kv_blocks_used,
                "kv_blocks_total": self.config.kv_blocks,
                "prefix_cache_queries_tokens": counters.prefix_cache_queries_tokens,
                "prefix_cache_hits_tokens": counters.prefix_cache_hits_tokens,
                "prompt_tokens_total": counters.prompt_tokens_total,
                "generation_tokens_total": counters.generation_tokens_total,
                # kv_transfers, recomputed_prefills, local_prefills, prefill_legs,
                # bootstrap_failures
                **dataclasses.asdict(self.handoff.counters),
                "kv_blocks_held": self.handoff.holds.blocks_held,
                "bootstrap_rooms": len(self.handoff.rooms),
                # LoRA: runtime loads, and adapters that evicted another from a full slot
                # table (0 without --enable-lora)
                "lora_loads": self.lora.loads if self.lora is not None else 0,
                "lora_swaps": self.lora.swaps if self.lora is not None else 0,
            }
        )

    async def faults(self, request: web.Request) -> web.Response:
        """``POST /sim/faults``: change the injected faults at runtime, every key
        optional: ``{"status": "503:0.2,404:0.1"}`` (as --fault-status; ``""`` = none),
        ``{"metrics": "ok"|"fail"|"slow:SECONDS"}`` (as --fault-metrics;
        ``{"metrics_down": bool}`` is ``fail``/``ok``), ``{"seed": n}`` (restart the
        draws, as --fault-seed), ``{"kv_events_drop": n}`` (do not send the next n
        KV-event messages: a subscriber sees a sequence gap; the replay socket still has
        them). Answers the faults now in force."""
        try:
            doc = orjson.loads(await request.read())
            update = _fault_update(doc, self.injected_faults)
        except (orjson.JSONDecodeError, AttributeError, TypeError, ValueError) as exc:
            keys = ", ".join(sorted(_FAULT_KEYS))
            return error_response(SimError(400, f"/sim/faults: {exc} (keys: {keys})"))
        statuses, metrics, seed, drop = update
        if drop and self.kv_events is None:
            return error_response(SimError(400, "kv_events_drop: KV events are off"))
        self.injected_faults.statuses, self.injected_faults.metrics = statuses, metrics
        if seed is not None:
            self.injected_faults.reseed(seed)
        if drop and self.kv_events is not None:
            self.kv_events.drop_next(drop)
        return json_response(
            {
                "status": self.injected_faults.status_spec(),
                "metrics": metrics.spec,
                "metrics_down": metrics.fail,
                "kv_events_drop": drop,
                "injected": self.injected_faults.injected,
            }
        )

    async def last_request_info(self, request: web.Request) -> web.Response:
        if self.last_request is None:
            return error_response(SimError(404, "No request to /v1/* has been received yet"))
        return json_response(self.last_request.to_json())


async def _after_first(
    tokens: AsyncGenerator[int, None], step: Callable[[], Awaitable[None]]
) -> AsyncGenerator[int, None]:
    """``tokens``, awaiting ``step`` once the first one (the prefill) is done."""
    async with aclosing(tokens):
        async for index in tokens:
            if index == 0:
                await step()
            yield index


_FAULT_KEYS = {"status", "metrics", "metrics_down", "seed", "kv_events_drop"}


def _fault_update(
    doc: object, now: Faults
) -> tuple[tuple[tuple[int, float], ...], MetricsFault, int | None, int]:
    """A /sim/faults body → (statuses, metrics fault, new seed or None, events to drop);
    TypeError/ValueError with the reason when it is not one."""
    if not isinstance(doc, dict) or not doc or not set(doc) <= _FAULT_KEYS:
        raise TypeError("expected a JSON object with some of the keys")
    status, metrics = doc.get("status"), doc.get("metrics")
    down, seed, drop = doc.get("metrics_down"), doc.get("seed"), doc.get("kv_events_drop", 0)
    if not isinstance(status, str | None) or not isinstance(metrics, str | None):
        raise TypeError("status and metrics are strings")
    if not isinstance(down, bool | None) or (down is not None and metrics is not None):
        raise TypeError("metrics_down is true or false, and not beside metrics")
    for name, value in (("seed", seed), ("kv_events_drop", drop)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise TypeError(f"{name} is an integer >= 0")
        if value is not None and value < 0:
            raise ValueError(f"{name} is an integer >= 0")
    statuses = now.statuses if status is None else parse_fault_status(status)
    fault = now.metrics if metrics is None else parse_fault_metrics(metrics)
    if down is not None:
        fault = MetricsFault(fail=down)
    return statuses, fault, seed, drop


class _CountTokens(apis.Messages):
    """count_tokens: a Messages body without ``max_tokens`` (nothing is generated)."""

    def to_openai(self, doc: dict[str, Any]) -> tuple[ApiKind, dict[str, Any]]:
        return super().to_openai({**doc, "max_tokens": 1, "stream": False})


_COUNT_TOKENS = _CountTokens()
SIM_SERVER = web.AppKey("sim_server", SimServer)


def make_app(config: SimConfig) -> web.Application:
    """The simulator's aiohttp application (``app[SIM_SERVER]`` is its SimServer).

    Run it with ``handler_cancellation=True`` so a client that disconnects while its
    request waits or prefills frees its place at once.
    """
    server = SimServer(config)
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app[SIM_SERVER] = server
    app.on_response_prepare.append(server.tag_response)
    app.router.add_post("/v1/completions", server.route(apis.SimApi(ApiKind.COMPLETION)))
    app.router.add_post("/v1/chat/completions", server.route(apis.SimApi(ApiKind.CHAT)))
    app.router.add_post("/v1/messages", server.route(apis.Messages()))
    app.router.add_post("/v1/messages/count_tokens", server.count_tokens)
    app.router.add_post("/v1/responses", server.route(apis.Responses()))
    app.router.add_post("/v1/embeddings", server.route(apis.Embeddings()))
    app.router.add_post("/inference/v1/generate", server.route(apis.VllmGenerate()))
    app.router.add_post("/generate", server.route(apis.SglangGenerate()))
    app.router.add_get("/v1/models", server.models)
    app.router.add_get("/health", server.health)
    app.router.add_get("/metrics", server.prometheus)
    app.router.add_post("/tokenize", server.tokenize)
    app.router.add_post("/reset_prefix_cache", server.reset_prefix_cache)
    app.router.add_get("/sim/stats", server.stats)
    app.router.add_get("/sim/last-request", server.last_request_info)
    app.router.add_post("/sim/faults", server.faults)
    KvRoutes(server.handoff).add_to(app)
    if server.lora is not None:
        LoraRoutes(server.lora).add_to(app)
    app.on_cleanup.append(server.close)
    return app
