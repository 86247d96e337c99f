"""The simulator's KV connector: how a request's prefill and decode legs meet.

``SimHandoff.prepare`` runs before the engine and turns a request into a :class:`Plan`:
how many prompt tokens arrive from elsewhere, what to do once the prefill is computed,
and what to add to the response. Each request counts exactly once, as a prefill leg,
a KV transfer, a recomputed prefill (a handoff that was asked for and failed) or a
local prefill (no handoff asked for).

- ``nixl`` (vLLM NixlConnector, any role): ``do_remote_decode`` makes a prefill leg
  whose blocks are held (``KvHolds``) and named in the response; a decode leg pulls
  them over HTTP (``POST /sim/kv/pull`` on the prefill) or, if it cannot, recomputes.
- ``sglang`` / ``mooncake``: bootstrap fields make a ``prefill`` instance the prefill
  side of the room (``Rooms``) and a ``decode`` instance the joining side
  (``POST /sim/bootstrap/join`` on the prefill); ``prefill-decode`` ignores them.
- ``pool``: ``prefill`` writes the prompt's blocks to the pool, ``decode`` reads them,
  ``prefill-decode`` does both (vLLM's kv_producer / kv_consumer / kv_both).
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Awaitable, Callable
from contextlib import ExitStack
from typing import Any

import aiohttp
import orjson

from epp.types import Role
from epp_harness.sim import kv_params
from epp_harness.sim.bootstrap import Rooms
from epp_harness.sim.config import KvConnector, SimConfig
from epp_harness.sim.engine import Engine
from epp_harness.sim.kv_holds import KvHolds
from epp_harness.sim.kv_pool import KvPool
from epp_harness.sim.protocol import GenerationRequest, SimError

log = logging.getLogger(__name__)

PULL_PATH = "/sim/kv/pull"
JOIN_PATH = "/sim/bootstrap/join"
# The joiner's HTTP timeout exceeds the wait it asks the room for, so the room's own
# 504 (which names the room) arrives first.
JOIN_GRACE_S = 2.0


@dataclasses.dataclass(slots=True)
class HandoffCounters:
    kv_transfers: int = 0  # a decode received its prompt's KV from elsewhere
    recomputed_prefills: int = 0  # a decode was handed KV it could not get
    local_prefills: int = 0  # no handoff asked for: prefilled here
    prefill_legs: int = 0  # served as the prefill leg of a P/D pair
    bootstrap_failures: int = 0  # a rendezvous timed out or failed (either side)


@dataclasses.dataclass(slots=True)
class Plan:
    """How to serve one request (``req`` may be rewritten, e.g. to one token)."""

    req: GenerationRequest
    received_tokens: int = 0
    # top-level fields added to a non-streaming response
    response_fields: dict[str, Any] = dataclasses.field(default_factory=dict)
    # awaited once the prefill is computed, before the first token goes out
    after_prefill: Callable[[], Awaitable[None]] | None = None


def remote_error(body: bytes) -> str:
    """The message of an ``{"error": {"message": ...}}`` body, else the body itself."""
    try:
        message = orjson.loads(body)["error"]["message"]
        if isinstance(message, str):
            return message
    except (orjson.JSONDecodeError, KeyError, TypeError):
        pass
    return body[:200].decode(errors="replace")


def tokens_in(body: bytes) -> int | None:
    """The ``tokens`` count of a pull or join answer, None if it has none."""
    try:
        tokens = orjson.loads(body).get("tokens")
    except (orjson.JSONDecodeError, AttributeError):
        return None
    return tokens if isinstance(tokens, int) and tokens >= 0 else None


class SimHandoff:
    """The KV connector of one instance: both sides of its protocol. (Not the EPP's
    ``epp.disagg.coordinators.Handoff``, one request's prefill/decode pair.)"""

    def __init__(self, config: SimConfig, engine: Engine) -> None:
        self.config = config
        self.engine = engine
        # vLLM engine ids are per process: a restarted prefill makes old params stale.
        self.engine_id = str(uuid.uuid4())
        self.counters = HandoffCounters()
        self.holds = KvHolds(engine, config.kv_hold_seconds)
        self.rooms = Rooms()
        self.pool = (
            KvPool(config.kv_pool_dir, config.model, config.block_size)
            if config.kv_pool_dir
            else None
        )
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:  # created lazily: needs the running loop
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        return self._session

    async def close(self) -> None:
        self.holds.close()
        if self._session is not None:
            await self._session.close()

    async def prepare(self, req: GenerationRequest, stack: ExitStack) -> Plan:
        """The plan for ``req``; raises SimError (400 on bad P/D fields, 504/500 when a
        rendezvous fails). ``stack`` holds what must stay open until the answer is out."""
        connector = self.config.kv_connector
        if connector is KvConnector.NIXL:
            return await self._nixl(req)
        if connector.rendezvous:
            return await self._rendezvous(req, stack)
        return await self._pool(req)

    def _local(self, req: GenerationRequest) -> Plan:
        self.counters.local_prefills += 1
        return Plan(req)

    # -- nixl ---------------------------------------------------------------------------

    async def _nixl(self, req: GenerationRequest) -> Plan:
        leg = kv_params.parse_nixl(req.body)
        if leg is None:
            return self._local(req)
        if leg.remote_decode:
            self.counters.prefill_legs += 1
            plan = Plan(req)

            async def hold() -> None:
                ids = self.holds.hold(req.prompt_tokens)
                plan.response_fields[kv_params.KV_TRANSFER_PARAMS] = kv_params.nixl_source_params(
                    self.engine_id, ids, self.config.host, self.config.port
                )

            plan.after_prefill = hold
            return plan
        if leg.source is None:
            return self._recompute(req, f"unusable kv_transfer_params: {leg.problem}")
        pulled = await self._pull_from(leg.source)
        if isinstance(pulled, str):
            return self._recompute(req, pulled)
        self.counters.kv_transfers += 1
        return Plan(req, received_tokens=pulled)

    def _recompute(self, req: GenerationRequest, reason: str) -> Plan:
        log.info("request %s: recomputing the prefill: %s", req.request_id, reason)
        self.counters.recomputed_prefills += 1
        return Plan(req)

    async def _pull_from(self, source: kv_params.RemotePrefill) -> int | str:
        """Pull the blocks: their prompt tokens, or why the pull failed."""
        doc = {"engine_id": source.engine_id, "block_ids": list(source.block_ids)}
        timeout = aiohttp.ClientTimeout(total=self.config.bootstrap_timeout_seconds)
        url = f"http://{source.address}{PULL_PATH}"
        try:
            async with self._client().post(url, data=orjson.dumps(doc), timeout=timeout) as resp:
                status, body = resp.status, await resp.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            return f"pull from {source.address} failed: {type(exc).__name__}: {exc}"
        if status != 200:
            return f"pull from {source.address}: HTTP {status}: {remote_error(body)}"
        tokens = tokens_in(body)
        if tokens is None:
            return f"pull from {source.address}: no token count in {body[:200]!r}"
        return tokens

    def hand_out(self, engine_id: str, block_ids: list[int]) -> int:
        """The prefill side of a pull: hand over held blocks (SimError 404/410 if not)."""
        if engine_id != self.engine_id:
            raise SimError(404, f"unknown engine id {engine_id!r} (this is {self.engine_id})")
        tokens = self.holds.take(block_ids)
        if tokens is None:
            raise SimError(
                410,
                "the blocks are not held here (pulled already, held longer than "
                f"{self.config.kv_hold_seconds:g}s, or never handed out)",
            )
        return tokens

    # -- sglang / mooncake --------------------------------------------------------------

    async def _rendezvous(self, req: GenerationRequest, stack: ExitStack) -> Plan:
        boot = kv_params.parse_bootstrap(req.body)
        role = self.config.role
        if boot is None or role is Role.BOTH:
            return self._local(req)
        timeout = self.config.bootstrap_timeout_seconds
        if role is Role.PREFILL:
            side = stack.enter_context(self.rooms.prefill(boot.room))
            try:
                await side.wait_for_decode(timeout)
            except SimError:
                self.counters.bootstrap_failures += 1
                raise
            self.counters.prefill_legs += 1

            async def hand_over() -> None:
                side.hand_over(req.prompt_tokens)

            # The prefill side answers one token, not streamed, whatever the body asked.
            one = dataclasses.replace(req, max_tokens=1, stream=False, include_usage=False)
            return Plan(one, after_prefill=hand_over)
        tokens = await self._join(boot, timeout)
        self.counters.kv_transfers += 1
        return Plan(req, received_tokens=tokens)

    async def _join(self, boot: kv_params.Bootstrap, within: float) -> int:
        """Join the room on the prefill instance and wait for its KV (prompt tokens)."""
        url = f"http://{boot.address}{JOIN_PATH}"
        doc = {"room": boot.room, "timeout_seconds": within}
        try:
            async with self._client().post(
                url,
                data=orjson.dumps(doc),
                timeout=aiohttp.ClientTimeout(total=within + JOIN_GRACE_S),
            ) as resp:
                status, body = resp.status, await resp.read()
        except TimeoutError:
            status, body = 504, b""
        except aiohttp.ClientError as exc:
            self.counters.bootstrap_failures += 1
            raise SimError(
                500,
                f"bootstrap room {boot.room}: cannot reach the bootstrap server at "
                f"{boot.address}: {type(exc).__name__}: {exc}",
            ) from None
        tokens = tokens_in(body) if status == 200 else None
        if tokens is not None:
            return tokens
        self.counters.bootstrap_failures += 1
        message = remote_error(body) if body else f"no answer within {within:g}s"
        raise SimError(
            504 if status == 504 else 500,
            message if str(boot.room) in message else f"bootstrap room {boot.room}: {message}",
        )

    # -- pool ---------------------------------------------------------------------------

    async def _pool(self, req: GenerationRequest) -> Plan:
        assert self.pool is not None  # SimConfig requires a pool dir for this connector
        pool, role = self.pool, self.config.role
        hashes = self.engine.block_hashes(req)
        plan = Plan(req)
        if role is not Role.DECODE:  # prefill and prefill-decode write the pool

            async def store() -> None:
                await pool.add(hashes)

            plan.after_prefill = store
        if role is Role.PREFILL:
            self.counters.prefill_legs += 1
            return plan
        # Blocks this instance has cached itself are not fetched again (as LMCache).
        in_pool = await pool.match(hashes)
        if in_pool > self.engine.cached_blocks(hashes):
            self.counters.kv_transfers += 1
            plan.received_tokens = min(in_pool * self.config.block_size, req.prompt_tokens)
        else:
            self.counters.local_prefills += 1
        return plan
