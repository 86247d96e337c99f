"""Admin API for elastic membership: ``POST /instances/add``, ``POST /instances/remove``
(API key required) and ``GET``/``POST /status`` (open).

Bodies follow the vllm-ascend elastic proxies: ``{"type": "prefill" | "decode" |
"prefill-decode", "instance": "ip:port"}`` or ``"instances": ["ip:port", ...]`` (a single
string is accepted too). Every bad input gets a 400 naming the field and the problem.
"""

from __future__ import annotations

import asyncio
import ipaddress
import time
from collections.abc import Callable
from typing import Any

import orjson
from aiohttp import web

from epp.admin.auth import ApiKeyAuth
from epp.admin.replies import error, ok
from epp.datastore import Datastore, Member, Status
from epp.discovery.runtime import Outcome, RuntimeMembership
from epp.scheduling.latency import LatencyModel
from epp.types import Endpoint, Role, parse_host_port

# what /status reports for each member, and how many failures it has had
FailureState = Callable[[str], tuple[int, float | None]]


class BadInput(ValueError):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


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
    given = doc.get("instance", doc.get("instances"))
    items = [given] if isinstance(given, str) else given
    if not isinstance(items, list) or not items or not all(isinstance(i, str) for i in items):
        raise BadInput(
            "invalid_instances",
            "'instances' must be an 'ip:port' string or a non-empty list of them",
        )
    return role, [_endpoint(i, role, engine) for i in items]


def _endpoint(text: str, role: Role, engine: str) -> Endpoint:
    try:
        host, port = parse_host_port(text)
        # canonical form ("::1", not "0:0::1"): one member per server, and the same
        # spelling Envoy uses when it reports which upstream answered
        host = ipaddress.ip_address(host).compressed
    except ValueError as exc:
        message = str(exc)
        if not message.startswith("malformed"):  # the host is not an IP literal
            message = f"malformed address {text!r}: the host must be an IP address"
        raise BadInput("invalid_instance", message) from None
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
    datastore: Datastore, failures: FailureState, latency: LatencyModel | None = None
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
    m: Member, datastore: Datastore, failures: FailureState, latency: LatencyModel | None
) -> dict[str, Any]:
    count, retry_in = failures(m.address)
    doc: dict[str, Any] = {
        "instance": m.address,
        "type": m.endpoint.role.value,
        "state": m.status.value,
        "in_flight": datastore.in_flight(m.address),
        "consecutive_failures": count,
    }
    if retry_in is not None:
        doc["next_check_in_s"] = round(retry_in, 3)
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
    learned = latency.status(m.address) if latency is not None else None
    if learned is not None:
        doc["latency_model"] = learned
    return doc


_MESSAGES = {
    Outcome.ADDED: "added {role} instances: {items}",
    Outcome.UPDATED: "changed to {role}: {items}",
    Outcome.EXISTS: "{role} instances already present: {items}",
    Outcome.WAITING: "{role} instances waiting to start: {items}",
    Outcome.REMOVED: "removed {role} instances: {items}",
    Outcome.DRAINING: "draining {role} instances (they go when their requests finish): {items}",
    Outcome.NOT_FOUND: "not in the {role} instances: {items}",
    Outcome.WITHDRAWN: "{role} instances removed while being verified: {items}",
}


def _message(role: Role, results: dict[str, Outcome]) -> str:
    parts = []
    for outcome, text in _MESSAGES.items():
        items = [a for a, o in results.items() if o is outcome]
        if items:
            parts.append(text.format(role=role.value, items=items))
    return "; ".join(parts) + "."


def add_routes(
    app: web.Application,
    datastore: Datastore,
    membership: RuntimeMembership,
    auth: ApiKeyAuth,
    failures: FailureState,
    engine: str,
    latency: LatencyModel | None = None,
) -> None:
    async def read(request: web.Request) -> tuple[Role, list[Endpoint]] | web.Response:
        refusal = auth.refusal(request)
        if refusal is not None:
            return refusal
        try:
            return parse_body(await request.read(), engine)
        except BadInput as exc:
            return error(400, exc.code, str(exc))

    async def add(request: web.Request) -> web.Response:
        parsed = await read(request)
        if isinstance(parsed, web.Response):
            return parsed
        role, endpoints = parsed
        outcomes = await asyncio.gather(*(membership.add(e) for e in endpoints))
        results = {e.address: o for e, o in zip(endpoints, outcomes, strict=True)}
        waiting = any(o is Outcome.WAITING for o in results.values())
        doc = {"message": _message(role, results), "results": results, **_summary(datastore)}
        return ok(doc, status=202 if waiting else 200)

    async def remove(request: web.Request) -> web.Response:
        parsed = await read(request)
        if isinstance(parsed, web.Response):
            return parsed
        role, endpoints = parsed
        results = {}
        for e in endpoints:
            member = datastore.member(e.address)
            if member is None or member.endpoint.role is not role:
                results[e.address] = Outcome.NOT_FOUND
            else:
                results[e.address] = membership.remove(e.address)
        found = any(o is not Outcome.NOT_FOUND for o in results.values())
        doc = {"message": _message(role, results), "results": results, **_summary(datastore)}
        return ok(doc, status=200 if found else 404)

    async def status(_: web.Request) -> web.Response:
        return ok(status_doc(datastore, failures, latency))

    app.router.add_post("/instances/add", add)
    app.router.add_post("/instances/remove", remove)
    app.router.add_get("/status", status)
    app.router.add_post("/status", status)
