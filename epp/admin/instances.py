"""Admin API for elastic membership: ``POST /instances/add``, ``POST /instances/remove``
(API key required; ``/instance/add`` and ``/instance/remove`` are aliases) and
``GET``/``POST /status`` (open).

Bodies follow the vllm-ascend elastic proxies: ``{"type": "prefill" | "decode" |
"prefill-decode", "instance": "host:port"}`` or ``"instances": ["host:port", ...]`` (a
single string is accepted too); a host may be an IP or a name. An optional ``"engine":
"vllm" | "sglang" | "trtllm"`` (or an installed dialect) says whose metric names the
servers speak (default: ``dataLayer.engine``). Every bad input gets a
400 naming the field and the problem. Answers carry both proxies' message forms: the
list form of the vllm-ascend load-balance proxy (``message``) and the per-instance lines
of its elastic proxy example (``instance_messages``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import Any

import orjson
from aiohttp import web

from epp.admin.auth import ApiKeyAuth
from epp.common.addresses import is_ip, join, parse_address
from epp.common.replies import error, ok
from epp.datalayer.ejection import FailureState
from epp.datalayer.engines import ENGINES
from epp.datastore import Datastore, Member, Status
from epp.discovery.names import NameResolver, ResolveError
from epp.discovery.runtime import Outcome, RuntimeMembership
from epp.errors import BadRequestError
from epp.scheduling.latency import LatencyModel
from epp.types import Endpoint, Role

# what /status reports about each member's failures
Failures = Callable[[str], FailureState]


class BadInput(BadRequestError):
    """A bad /instances body: 400, ``code`` says which part."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message, code)
        self.code: str = code


def parse_body(raw: bytes, engine: str = "vllm") -> tuple[Role, list[Endpoint]]:
    """The role and endpoints a request names; BadInput says precisely what is wrong."""
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadInput("invalid_json", f"body is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise BadInput("invalid_body", "body must be a JSON object")
    kind = doc.get("type")
    if not isinstance(kind, str):
        raise BadInput("missing_type", "'type' is required: one of prefill, decode, prefill-decode")
    try:
        role = Role.parse(kind)
    except ValueError as exc:
        raise BadInput("invalid_type", f"'type': {exc}") from None
    if ("instance" in doc) == ("instances" in doc):
        raise BadInput("missing_instance", "give exactly one of 'instance' or 'instances'")
    engine = _engine(doc.get("engine", engine))
    given = doc.get("instance", doc.get("instances"))
    items = [given] if isinstance(given, str) else given
    if not isinstance(items, list) or not items or not all(isinstance(i, str) for i in items):
        raise BadInput(
            "invalid_instances",
            "'instances' must be a 'host:port' string or a non-empty list of them",
        )
    return role, [_endpoint(i, role, engine) for i in items]


def _engine(value: object) -> str:
    """The optional ``engine`` field: whose metric names the servers speak."""
    if not isinstance(value, str) or value not in ENGINES:
        known = ", ".join(sorted(ENGINES))
        raise BadInput("invalid_engine", f"'engine' must be one of {known}, got {value!r}")
    return value


def _endpoint(text: str, role: Role, engine: str) -> Endpoint:
    try:
        host, port = parse_address(text)
    except ValueError as exc:
        raise BadInput("invalid_instance", str(exc)) from None
    return Endpoint(host, port, role, engine=engine)


def _summary(datastore: Datastore) -> dict[str, list[str]]:
    """Healthy prefill and decode instances (prefill-decode ones count in both)."""
    prefill, decode = [], []
    for m in datastore.members():
        if m.status is not Status.ACTIVE:
            continue
        if m.endpoint.role in (Role.PREFILL, Role.BOTH):
            prefill.append(m.address)
        if m.endpoint.role in (Role.DECODE, Role.BOTH):
            decode.append(m.address)
    return {"current_prefill_instances": prefill, "current_decode_instances": decode}


def status_doc(
    datastore: Datastore, failures: Failures, latency: LatencyModel | None = None
) -> dict[str, Any]:
    summary = _summary(datastore)
    prefill, decode = summary["current_prefill_instances"], summary["current_decode_instances"]
    return {
        "prefill_node_count": len(prefill),
        "decode_node_count": len(decode),
        "prefill_nodes": prefill,
        "decode_nodes": decode,
        "endpoints": [_member_doc(m, datastore, failures, latency) for m in datastore.members()],
    }


def _member_doc(
    m: Member, datastore: Datastore, failures: Failures, latency: LatencyModel | None
) -> dict[str, Any]:
    failing = failures(m.address)
    doc: dict[str, Any] = {
        "instance": m.address,
        "type": m.endpoint.role.value,
        "state": m.status.value,
        "in_flight": datastore.in_flight(m.address),
        "consecutive_failures": failing.failures,
    }
    if m.endpoint.name:
        doc["name"] = m.endpoint.name
    if failing.next_probe_in_s is not None:
        doc["next_check_in_s"] = round(failing.next_probe_in_s, 3)
    if failing.removal_in_s is not None:
        doc["removal_in_s"] = round(failing.removal_in_s, 3)
    if m.status is Status.DRAINING:
        doc["drain_deadline_in_s"] = round(max(m.until - time.monotonic(), 0.0), 3)
    metrics = m.state.metrics
    if metrics is not None:
        doc["load"] = {
            "waiting": metrics.waiting,
            "running": metrics.running,
            "kv_cache_usage": metrics.kv_usage,
            "age_s": round(max(time.monotonic() - metrics.updated_at, 0.0), 3),
        }
        if metrics.block_size is not None:  # the KV-cache geometry (cache_config_info)
            doc["load"].update(block_size=metrics.block_size, num_blocks=metrics.num_blocks)
        if metrics.prefix_cache_queries is not None:  # counters: `epp top` takes rates
            doc["load"]["prefix_cache"] = {
                "queried_tokens": metrics.prefix_cache_queries,
                "hit_tokens": metrics.prefix_cache_hits,
            }
        if metrics.max_lora is not None:  # vllm:lora_requests_info
            doc["load"]["lora"] = {
                "max_lora": metrics.max_lora,
                "running": sorted(metrics.lora_running),
                "waiting": sorted(metrics.lora_waiting),
            }
    learned = latency.status(m.address) if latency is not None else None
    if learned is not None:
        doc["latency_model"] = learned
    return doc


# the vllm-ascend load-balance proxy's message: "add prefill instances: ['a', 'b']."
# (Python's list repr, as it prints them), then one sentence per other outcome
_LISTED = {"add": (Outcome.ADDED,), "remove": (Outcome.REMOVED, Outcome.DRAINING)}
_SENTENCES = {
    Outcome.WAITING: "Instances {items} are waiting to be added.",
    Outcome.UPDATED: "Instances {items} changed to {role}.",
    Outcome.EXISTS: "Instances {items} are already present.",
    Outcome.DRAINING: "Instances {items} are draining (they go when their requests finish).",
    Outcome.NOT_FOUND: "Instances {items} are not in the {role} instances.",
    Outcome.WITHDRAWN: "Instances {items} were removed while being verified.",
}
# its elastic proxy example's one line per instance
_LINES = {
    Outcome.ADDED: "Added {a} to {role}_instances.",
    Outcome.UPDATED: "Added {a} to {role}_instances.",
    Outcome.EXISTS: "{role}_instance {a} already exists.",
    Outcome.WAITING: "Waiting for {role}_instance {a} to start.",
    Outcome.REMOVED: "Removed {a} from {role}_instances.",
    Outcome.DRAINING: "Removed {a} from {role}_instances.",
    Outcome.NOT_FOUND: "Instance {a} is not in the {role}_instances.",
    Outcome.WITHDRAWN: "Instance {a} was removed while being verified.",
}


def message(verb: str, role: Role, results: dict[str, Outcome]) -> str:
    """``verb`` ("add" or "remove") {role} instances: [...]. and the other outcomes."""
    listed = [a for a, o in results.items() if o in _LISTED[verb]]
    parts = [f"{verb} {role.value} instances: {listed}."]
    for outcome, text in _SENTENCES.items():
        items = [a for a, o in results.items() if o is outcome]
        if items:
            parts.append(text.format(role=role.value, items=items))
    return " ".join(parts)


def instance_messages(role: Role, results: dict[str, Outcome]) -> list[str]:
    return [_LINES[o].format(a=a, role=role.value) for a, o in results.items()]


def _reply(verb: str, role: Role, results: dict[str, Outcome], ds: Datastore) -> dict[str, Any]:
    return {
        "message": message(verb, role, results),
        "instance_messages": instance_messages(role, results),
        "results": results,
        **_summary(ds),
    }


def add_membership_routes(
    app: web.Application,
    datastore: Datastore,
    membership: RuntimeMembership,
    auth: ApiKeyAuth,
    engine: str,
    resolver: NameResolver,
) -> None:
    """``POST /instances/add`` and ``/instances/remove`` (and the ``/instance/`` aliases)."""

    async def read(request: web.Request) -> tuple[Role, list[Endpoint]] | web.Response:
        refusal = auth.refusal(request)
        if refusal is not None:
            return refusal
        try:
            return parse_body(await request.read(), engine)
        except BadInput as exc:
            return error(exc.status, exc.code, exc.message)

    async def add(request: web.Request) -> web.Response:
        parsed = await read(request)
        if isinstance(parsed, web.Response):
            return parsed
        role, named = parsed
        try:  # every name first: one that does not resolve adds nothing
            endpoints = await asyncio.gather(*(resolver.resolve(e) for e in named))
        except ResolveError as exc:
            return error(400, "unresolvable_instance", str(exc))
        outcomes = await asyncio.gather(*(membership.add(e) for e in endpoints))
        results = {e.address: o for e, o in zip(endpoints, outcomes, strict=True)}
        waiting = any(o is Outcome.WAITING for o in results.values())
        return ok(_reply("add", role, results, datastore), status=202 if waiting else 200)

    async def remove(request: web.Request) -> web.Response:
        parsed = await read(request)
        if isinstance(parsed, web.Response):
            return parsed
        role, named = parsed
        addresses = []
        for e in named:  # every name first: one that does not resolve removes nothing
            address = e.address
            if not is_ip(e.host):  # the address the name was added under, else its own now
                address = resolver.address_of(join(e.host, e.port)) or address
                if datastore.member(address) is None:
                    try:
                        address = (await resolver.resolve(e)).address
                    except ResolveError as exc:
                        return error(400, "unresolvable_instance", str(exc))
            addresses.append(address)
        results = {}
        for address in addresses:
            member = datastore.member(address)
            if member is None or member.endpoint.role is not role:
                results[address] = Outcome.NOT_FOUND
            else:
                results[address] = membership.remove(address)
        found = any(o is not Outcome.NOT_FOUND for o in results.values())
        return ok(_reply("remove", role, results, datastore), status=200 if found else 404)

    # /instance/...: the spelling in the elastic proxy example's comments
    for prefix in ("/instances", "/instance"):
        app.router.add_post(f"{prefix}/add", add)
        app.router.add_post(f"{prefix}/remove", remove)


def add_status_routes(
    app: web.Application,
    datastore: Datastore,
    failures: Failures,
    latency: LatencyModel | None = None,
    flow_control: Callable[[], Mapping[str, Any]] | None = None,
) -> None:
    """``GET`` and ``POST /status``: every member, its state, load and failures; and
    flow control's queues when given."""

    async def status(_: web.Request) -> web.Response:
        doc = status_doc(datastore, failures, latency)
        if flow_control is not None:
            doc["flow_control"] = flow_control()
        return ok(doc)

    app.router.add_get("/status", status)
    app.router.add_post("/status", status)
