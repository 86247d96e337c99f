"""Each coordinator driven through an in-memory LegTransport: the prefill leg it sends
(URL, headers, body), the decode leg it hands back, what it does when the prefill
server fails, rejects or is slow, and that no load claim or leg outlives it."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import orjson
import pytest

from epp.datastore import Datastore
from epp.disagg.coordinators import (
    COORDINATORS,
    ConcurrentCoordinator,
    Coordinator,
    CoordinatorEnv,
    DecodeLeg,
    Handoff,
    KvPoolCoordinator,
    NixlCoordinator,
    SidecarCoordinator,
)
from epp.disagg.legs import LegClient
from epp.errors import NoEndpointError, PrefillRejectedError
from epp.observability.metrics import EppMetrics
from epp.types import Endpoint, InferenceRequest, Role
from tests.support.legs import Handler, MemoryLegTransport, SentLeg, answer, held, times_out

PREFILL = Endpoint("10.0.0.1", 8000, Role.PREFILL)
DECODE = Endpoint("10.0.0.2", 8000, Role.DECODE)
PROMPT = "tell me about disaggregation " * 10
# the client's body, as the stream hands it over (client-sent P/D fields already gone)
CLIENT_DOC: Mapping[str, Any] = {
    "model": "m",
    "prompt": PROMPT,
    "max_tokens": 50,
    "stream": True,
    "stream_options": {"include_usage": True},
}
CLIENT_HEADERS = {
    "authorization": "Bearer t0ken",
    "x-request-id": "client-id",
    "x-gateway-inference-objective": "chat",
    "cookie": "session=1",
    "content-type": "text/plain",
    "content-length": "999",
}
# what a prefill leg carries: the forwarded headers, the EPP's request id, JSON
LEG_HEADERS = {
    "authorization": "Bearer t0ken",
    "x-request-id": "r-1",
    "x-gateway-inference-objective": "chat",
    "content-type": "application/json",
}
RETURNED_KV = {
    "do_remote_prefill": True,
    "do_remote_decode": False,
    "remote_engine_id": "engine-1",
    "remote_block_ids": [4, 5, 6],
    "remote_host": "10.0.0.1",
    "remote_port": 5600,
}
ONE_TOKEN = {**CLIENT_DOC, "stream": False, "max_tokens": 1}
del ONE_TOKEN["stream_options"]


@dataclass
class Rig:
    transport: MemoryLegTransport
    datastore: Datastore
    metrics: EppMetrics
    env: CoordinatorEnv
    successes: list[str] = field(default_factory=list)
    failures: list[tuple[str, str, bool]] = field(default_factory=list)

    def outcomes(self, coordinator: str) -> dict[str, float]:
        out = {}
        for outcome in ("ok", "failed", "rejected", "no_kv_params"):
            value = self.metrics.registry.get_sample_value(
                "epp_prefill_legs_total", {"coordinator": coordinator, "outcome": outcome}
            )
            if value:
                out[outcome] = value
        return out

    def timed_legs(self, coordinator: str) -> float | None:
        return self.metrics.registry.get_sample_value(
            "epp_prefill_leg_duration_seconds_count", {"coordinator": coordinator}
        )

    def assert_nothing_left(self) -> None:
        assert self.datastore.in_flight(PREFILL.address) == 0
        assert self.datastore.in_flight(DECODE.address) == 0
        assert self.transport.open == 0


def rig(
    prefill: Handler | None = None,
    *,
    bootstrap_port: int | None = None,
    connect_gate: asyncio.Event | None = None,
) -> Rig:
    servers = {PREFILL.address: prefill} if prefill is not None else {}
    transport = MemoryLegTransport(servers, connect_gate)
    ds = Datastore()
    ds.add(PREFILL)
    ds.add(DECODE)
    metrics = EppMetrics(ds)
    env = CoordinatorEnv(ds, metrics, LegClient(transport), random.Random(7), bootstrap_port)
    r = Rig(transport, ds, metrics, env)
    env.on_success = r.successes.append
    env.on_failure = lambda address, reason, serving: r.failures.append((address, reason, serving))
    return r


def handoff(prefill: Endpoint = PREFILL, path: str = "/v1/completions") -> Handoff:
    request = InferenceRequest(
        "r-1", "m", path, PROMPT, stream=True, max_tokens=50, headers=CLIENT_HEADERS
    )
    return Handoff(request, CLIENT_DOC, prefill, DECODE)


def in_flight_seen(r: Rig, then: Handler) -> tuple[list[int], Handler]:
    """A server that notes the prefill endpoint's in-flight count while it serves."""
    seen: list[int] = []

    async def handle(leg: SentLeg) -> tuple[int, bytes]:
        seen.append(r.datastore.in_flight(PREFILL.address))
        return await then(leg)

    return seen, handle


# -- nixl: prefill leg first, then the decode body carries kv_transfer_params ----------


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
async def test_nixl_prefills_one_token_and_the_decode_body_carries_the_returned_params(
    path: str,
) -> None:
    r = rig()
    seen, r.transport.servers[PREFILL.address] = in_flight_seen(
        r, answer(200, {"choices": [{"text": "x"}], "kv_transfer_params": RETURNED_KV})
    )
    leg = await NixlCoordinator(r.env).hand_off(handoff(path=path))
    [sent] = r.transport.sent
    assert sent.url == f"http://10.0.0.1:8000{path}"
    assert sent.headers == LEG_HEADERS
    assert sent.json() == {
        **ONE_TOKEN,
        "kv_transfer_params": {
            "do_remote_decode": True,
            "do_remote_prefill": False,
            "remote_engine_id": None,
            "remote_block_ids": None,
            "remote_host": None,
            "remote_port": None,
        },
    }
    assert leg == DecodeLeg(doc={**CLIENT_DOC, "kv_transfer_params": RETURNED_KV})
    assert seen == [1]  # the leg counts against the prefill endpoint while it runs
    assert r.outcomes("nixl") == {"ok": 1}
    assert r.timed_legs("nixl") == 1
    assert (r.successes, r.failures) == ([PREFILL.address], [])
    r.assert_nothing_left()


@pytest.mark.parametrize(
    "server",
    [answer(200, {"choices": []}), answer(200, {"kv_transfer_params": {}}), answer(200, raw=b"ok")],
    ids=["no-params", "empty-params", "not-json"],
)
async def test_nixl_decodes_alone_when_the_prefill_returns_no_kv_params(server: Handler) -> None:
    r = rig(server)
    assert await NixlCoordinator(r.env).hand_off(handoff()) == DecodeLeg()
    assert r.outcomes("nixl") == {"no_kv_params": 1}
    assert r.successes == [PREFILL.address]  # the server answered: it works
    r.assert_nothing_left()


# (server, what the failure accounting is told: None = nothing, else serving)
FAILURES: list[tuple[str, Handler | None, str | None, bool | None]] = [
    ("unreachable", None, "prefill leg failed: 10.0.0.1:8000: ClientConnectorError", False),
    ("timeout", times_out(), "prefill leg failed: 10.0.0.1:8000: TimeoutError", False),
    ("503", answer(503, {"error": "overloaded"}), "prefill leg answered HTTP 503", True),
    ("500-not-json", answer(500, raw=b"boom"), "prefill leg answered HTTP 500", True),
    ("452", answer(452), None, None),  # past the client-error range, not a server fault
    ("302", answer(302), None, None),
]


@pytest.mark.parametrize(
    ("server", "reason", "serving"),
    [f[1:] for f in FAILURES],
    ids=[f[0] for f in FAILURES],
)
@pytest.mark.parametrize("name", ["nixl", "kv-pool"])
async def test_a_failed_prefill_leg_means_decode_alone(
    name: str, server: Handler | None, reason: str | None, serving: bool | None
) -> None:
    r = rig(server)
    coordinator = COORDINATORS[name](r.env)
    leg = coordinator.hand_off(handoff())
    assert not isinstance(leg, DecodeLeg)
    assert await leg == DecodeLeg()  # the client's body, unchanged, to the decode endpoint
    assert len(r.transport.sent) == 1
    assert r.outcomes(name) == {"failed": 1}
    assert r.successes == []
    if reason is None:
        assert r.failures == []
    else:
        [(address, told, told_serving)] = r.failures
        assert (address, told_serving) == (PREFILL.address, serving)
        assert told.startswith(reason)
    r.assert_nothing_left()


@pytest.mark.parametrize("name", ["nixl", "kv-pool"])
@pytest.mark.parametrize("status", [400, 404, 451])
async def test_a_prefill_client_error_goes_back_to_the_client(name: str, status: int) -> None:
    upstream = orjson.dumps({"error": {"message": "model m does not exist"}})
    r = rig(answer(status, raw=upstream))
    coordinator = COORDINATORS[name](r.env)
    leg = coordinator.hand_off(handoff())
    assert not isinstance(leg, DecodeLeg)
    with pytest.raises(PrefillRejectedError) as info:
        await leg
    assert (info.value.status, info.value.body()) == (status, upstream)
    assert r.outcomes(name) == {"rejected": 1}
    assert (r.successes, r.failures) == ([], [])  # a client error is no server fault
    r.assert_nothing_left()


# -- kv-pool: a one-token prefill fills the shared pool, the decode body is unchanged --


async def test_kv_pool_waits_for_a_one_token_prefill_then_sends_the_clients_body() -> None:
    release = asyncio.Event()
    r = rig(held(release, answer(200, {"choices": [{"text": "x"}]})))
    pending = asyncio.ensure_future(KvPoolCoordinator(r.env).hand_off(handoff()))
    for _ in range(3):
        await asyncio.sleep(0)
    assert not pending.done()  # the decode leg waits until the pool holds the KV
    assert r.datastore.in_flight(PREFILL.address) == 1
    [sent] = r.transport.sent
    assert sent.url == "http://10.0.0.1:8000/v1/completions"
    assert sent.headers == LEG_HEADERS
    assert sent.json() == ONE_TOKEN  # no kv_transfer_params: the pool is the hand-off
    release.set()
    assert await pending == DecodeLeg()
    assert r.outcomes("kv-pool") == {"ok": 1}
    assert r.successes == [PREFILL.address]
    r.assert_nothing_left()


# -- concurrent: one body with the bootstrap rendezvous to both, decode once connected --


@pytest.mark.parametrize(
    ("labels", "configured", "port"),
    [({}, None, 8000), ({}, 8998, 8998), ({"bootstrap-port": "9001"}, 8998, 9001)],
    ids=["own-port", "configured", "label"],
)
async def test_concurrent_routes_decode_with_the_same_body_once_the_prefill_is_on_the_wire(
    labels: dict[str, str], configured: int | None, port: int
) -> None:
    release = asyncio.Event()
    r = rig(held(release, answer(200, {"choices": []})), bootstrap_port=configured)
    prefill = Endpoint(PREFILL.host, PREFILL.port, Role.PREFILL, labels)
    coordinator = ConcurrentCoordinator(r.env)
    leg = await coordinator.hand_off(handoff(prefill))
    room = random.Random(7).getrandbits(63)
    expected = {**CLIENT_DOC, "bootstrap_host": "10.0.0.1", "bootstrap_port": port}
    assert leg == DecodeLeg(doc={**expected, "bootstrap_room": room})
    [sent] = r.transport.sent  # still running: each server waits for the other
    assert sent.url == "http://10.0.0.1:8000/v1/completions"
    assert sent.headers == LEG_HEADERS
    assert sent.json() == leg.doc
    assert r.transport.open == 1
    assert r.datastore.in_flight(PREFILL.address) == 1
    release.set()
    await coordinator.close()  # waits for the leg in the background
    assert r.outcomes("concurrent") == {"ok": 1}
    assert r.successes == [PREFILL.address]
    r.assert_nothing_left()


async def test_concurrent_decodes_alone_without_a_rendezvous_when_the_prefill_is_down() -> None:
    r = rig(None)
    coordinator = ConcurrentCoordinator(r.env)
    assert await coordinator.hand_off(handoff()) == DecodeLeg()
    await coordinator.close()
    assert r.outcomes("concurrent") == {"failed": 1}
    [(address, _, serving)] = r.failures
    assert (address, serving) == (PREFILL.address, False)
    r.assert_nothing_left()


@pytest.mark.parametrize(
    ("server", "outcome"),
    [(answer(404, {"error": {"message": "no"}}), "rejected"), (answer(503), "failed")],
    ids=["rejected", "5xx"],
)
async def test_concurrent_leaves_a_late_prefill_answer_to_the_decode_leg(
    server: Handler, outcome: str
) -> None:
    """Once the decode leg is routed the client gets the decode server's answer: a
    prefill error afterwards is counted, never raised."""
    release = asyncio.Event()
    r = rig(held(release, server))
    coordinator = ConcurrentCoordinator(r.env)
    leg = await coordinator.hand_off(handoff())
    assert leg.doc is not None and "bootstrap_room" in leg.doc
    release.set()
    await coordinator.close()
    assert r.outcomes("concurrent") == {outcome: 1}
    r.assert_nothing_left()


async def test_concurrent_timeout_after_connecting_is_a_failed_leg() -> None:
    late = asyncio.Event()
    r = rig(times_out(after=late))
    coordinator = ConcurrentCoordinator(r.env)
    leg = await coordinator.hand_off(handoff())
    assert leg.doc is not None  # the server took the request: decode meets it there
    late.set()
    await coordinator.close()
    assert r.outcomes("concurrent") == {"failed": 1}
    assert [(a, s) for a, _, s in r.failures] == [(PREFILL.address, False)]
    r.assert_nothing_left()


async def test_concurrent_cancelled_before_connecting_cancels_its_prefill_leg() -> None:
    """Envoy gave up while the prefill server was still being reached: the leg is
    cancelled with the hand-off, and its load claim released."""
    r = rig(answer(200), connect_gate=asyncio.Event())
    coordinator = ConcurrentCoordinator(r.env)
    pending = asyncio.ensure_future(coordinator.hand_off(handoff()))
    for _ in range(3):
        await asyncio.sleep(0)
    assert r.transport.open == 1 and r.datastore.in_flight(PREFILL.address) == 1
    pending.cancel()
    with pytest.raises(asyncio.CancelledError):
        await pending
    await asyncio.sleep(0)  # the leg's task runs its cancellation
    r.assert_nothing_left()  # gone with the hand-off, not only at close()
    await coordinator.close()
    assert r.outcomes("concurrent") == {}
    assert (r.successes, r.failures) == ([], [])
    r.assert_nothing_left()


# -- sidecar: no leg from the EPP; a header names the prefill server ------------------


async def test_sidecar_names_the_prefill_server_and_holds_its_claim() -> None:
    r = rig(answer(200))
    leg = SidecarCoordinator(r.env).hand_off(handoff())
    assert leg.doc is None  # the client's body: the sidecar rewrites it
    assert leg.headers == (("x-prefiller-host-port", "10.0.0.1:8000"),)
    assert r.transport.sent == []
    assert leg.prefill_ticket is not None
    assert r.datastore.in_flight(PREFILL.address) == 1  # until the request ends
    leg.prefill_ticket.release()
    r.assert_nothing_left()


# -- every registered coordinator ---------------------------------------------------


async def _decode_leg(coordinator: Coordinator, h: Handoff | None = None) -> DecodeLeg:
    leg = coordinator.hand_off(h or handoff())
    return leg if isinstance(leg, DecodeLeg) else await leg


@pytest.mark.parametrize("name", sorted(COORDINATORS))
async def test_every_coordinator_leaves_nothing_behind(name: str) -> None:
    for server in (answer(200, {"kv_transfer_params": RETURNED_KV}), None):
        r = rig(server)
        coordinator = COORDINATORS[name](r.env)
        leg = await _decode_leg(coordinator)
        assert leg.headers == () or name == "sidecar"
        if leg.prefill_ticket is not None:  # held for the request's life, then released
            leg.prefill_ticket.release()
        await coordinator.close()
        assert len(r.transport.sent) == (0 if name == "sidecar" else 1)
        r.assert_nothing_left()


# -- prefill failover: the next prefill endpoint before decoding alone ----------------

PREFILL_2 = Endpoint("10.0.0.3", 8000, Role.PREFILL)
KV_ANSWER = answer(200, {"choices": [{"text": "x"}], "kv_transfer_params": RETURNED_KV})


def failover_rig(first: Handler | None, second: Handler | None, **env: Any) -> Rig:
    r = rig(first)
    r.datastore.add(PREFILL_2)
    if second is not None:
        r.transport.servers[PREFILL_2.address] = second
    for key, value in env.items():
        setattr(r.env, key, value)
    return r


def failover_handoff() -> Handoff:
    return replace(handoff(), prefill_fallbacks=(PREFILL_2,))


@pytest.mark.parametrize(
    ("server", "reason", "serving"),
    [f[1:] for f in FAILURES],
    ids=[f[0] for f in FAILURES],
)
@pytest.mark.parametrize("name", ["nixl", "kv-pool"])
async def test_a_failed_prefill_leg_goes_to_the_next_prefill_endpoint(
    name: str, server: Handler | None, reason: str | None, serving: bool | None
) -> None:
    r = failover_rig(server, KV_ANSWER)
    coordinator = COORDINATORS[name](r.env)
    leg = coordinator.hand_off(failover_handoff())
    assert not isinstance(leg, DecodeLeg)
    decode = await leg
    if name == "nixl":  # the second server's params go to the decode endpoint
        assert decode.doc is not None and decode.doc["kv_transfer_params"] == RETURNED_KV
    assert [s.address for s in r.transport.sent] == [PREFILL.address, PREFILL_2.address]
    assert r.outcomes(name) == {"failed": 1, "ok": 1}
    assert r.successes == [PREFILL_2.address]
    assert [f[0] for f in r.failures] == ([] if reason is None else [PREFILL.address])
    r.assert_nothing_left()
    assert r.datastore.in_flight(PREFILL_2.address) == 0


async def test_every_prefill_endpoint_failing_means_decode_alone() -> None:
    r = failover_rig(answer(503), None)
    assert await NixlCoordinator(r.env).hand_off(failover_handoff()) == DecodeLeg()
    assert len(r.transport.sent) == 2
    assert r.outcomes("nixl") == {"failed": 2}
    r.assert_nothing_left()


async def test_a_prefill_client_error_is_not_retried_elsewhere() -> None:
    r = failover_rig(answer(400, {"error": {"message": "bad"}}), KV_ANSWER)
    with pytest.raises(PrefillRejectedError):
        await NixlCoordinator(r.env).hand_off(failover_handoff())
    assert [s.address for s in r.transport.sent] == [PREFILL.address]
    r.assert_nothing_left()


async def test_a_hung_prefill_server_leaves_its_share_of_the_budget_to_the_next() -> None:
    never = asyncio.Event()
    r = failover_rig(held(never, KV_ANSWER), KV_ANSWER, prefill_budget_s=0.1)
    leg = await NixlCoordinator(r.env).hand_off(failover_handoff())
    assert leg.doc is not None and leg.doc["kv_transfer_params"] == RETURNED_KV
    assert [s.address for s in r.transport.sent] == [PREFILL.address, PREFILL_2.address]
    assert r.outcomes("nixl") == {"failed": 1, "ok": 1}
    [(address, reason, serving)] = r.failures
    assert (address, reason, serving) == (
        PREFILL.address,
        "prefill leg failed: no answer within 0.05s",
        False,
    )
    r.assert_nothing_left()


async def test_the_budget_bounds_all_attempts_together() -> None:
    never = asyncio.Event()
    r = failover_rig(held(never, KV_ANSWER), held(never, KV_ANSWER), prefill_budget_s=0.1)
    loop = asyncio.get_running_loop()
    start = loop.time()
    assert await NixlCoordinator(r.env).hand_off(failover_handoff()) == DecodeLeg()
    assert loop.time() - start < 0.5
    assert r.outcomes("nixl") == {"failed": 2}
    r.assert_nothing_left()
    assert r.datastore.in_flight(PREFILL_2.address) == 0


async def test_concurrent_fails_over_to_the_next_prefill_before_routing_the_decode() -> None:
    release = asyncio.Event()
    r = failover_rig(None, held(release, answer(200, {"choices": []})))
    coordinator = ConcurrentCoordinator(r.env)
    leg = await coordinator.hand_off(failover_handoff())
    assert leg.doc is not None and leg.doc["bootstrap_host"] == PREFILL_2.host
    release.set()
    await coordinator.close()
    assert r.outcomes("concurrent") == {"failed": 1, "ok": 1}
    r.assert_nothing_left()


async def test_sidecar_names_the_fallbacks_in_a_header_of_their_own() -> None:
    r = failover_rig(answer(200), None)
    third = Endpoint("10.0.0.4", 8000, Role.PREFILL)
    h = replace(handoff(), prefill_fallbacks=(PREFILL_2, third))
    leg = SidecarCoordinator(r.env).hand_off(h)
    assert leg.headers == (
        ("x-prefiller-host-port", "10.0.0.1:8000"),
        ("x-prefiller-fallbacks", "10.0.0.3:8000,10.0.0.4:8000"),
    )
    assert leg.prefill_ticket is not None
    leg.prefill_ticket.release()
    r.assert_nothing_left()


# -- deferred decode selection: the decode endpoint is asked for after the leg ---------

DECODE_2 = Endpoint("10.0.0.5", 8000, Role.DECODE)


@dataclass
class Picks:
    """A decode pick behind the Handoff seam: records what it was told and what the
    prefill leg's state was at that moment; answers DECODE_2, or raises ``error``."""

    r: Rig
    error: Exception | None = None
    told: list[Endpoint | None] = field(default_factory=list)
    legs_open: list[int] = field(default_factory=list)

    def __call__(self, prefilled_on: Endpoint | None) -> Endpoint:
        self.told.append(prefilled_on)
        self.legs_open.append(self.r.transport.open + self.r.datastore.in_flight(PREFILL.address))
        if self.error is not None:
            raise self.error
        return DECODE_2


def deferred(picks: Picks) -> Handoff:
    return replace(handoff(), decode=None, pick_decode=picks)


@pytest.mark.parametrize("name", ["nixl", "kv-pool"])
async def test_a_deferring_coordinator_asks_for_the_decode_after_its_leg(name: str) -> None:
    release = asyncio.Event()
    r = rig(held(release, KV_ANSWER))
    r.env.defer_decode = True
    coordinator = COORDINATORS[name](r.env)
    assert coordinator.defers
    picks = Picks(r)
    pending = asyncio.ensure_future(_decode_leg(coordinator, deferred(picks)))
    for _ in range(3):
        await asyncio.sleep(0)
    assert picks.told == []  # not while the prefill leg runs
    release.set()
    leg = await pending
    assert picks.told == [PREFILL]  # once, naming the endpoint that prefilled
    assert picks.legs_open == [0]  # the leg was over, its claim released
    if name == "nixl":
        assert leg.doc is not None and leg.doc["kv_transfer_params"] == RETURNED_KV
    r.assert_nothing_left()


@pytest.mark.parametrize("name", ["nixl", "kv-pool"])
async def test_a_failed_leg_asks_for_a_decode_endpoint_that_prefills_alone(name: str) -> None:
    r = failover_rig(answer(503), None, defer_decode=True)
    picks = Picks(r)
    h = replace(failover_handoff(), decode=None, pick_decode=picks)
    assert await _decode_leg(COORDINATORS[name](r.env), h) == DecodeLeg()
    assert picks.told == [None]  # no prefill endpoint to leave out
    assert len(r.transport.sent) == 2  # after the failover, not before
    r.assert_nothing_left()


async def test_nixl_without_kv_params_asks_for_a_decode_endpoint_that_prefills_alone() -> None:
    r = rig(answer(200, {"choices": []}))
    picks = Picks(r)
    assert await _decode_leg(NixlCoordinator(r.env), deferred(picks)) == DecodeLeg()
    assert picks.told == [None]
    r.assert_nothing_left()


@pytest.mark.parametrize("name", ["nixl", "kv-pool"])
async def test_a_rejected_leg_never_asks_for_a_decode_endpoint(name: str) -> None:
    r = rig(answer(400, {"error": {"message": "bad"}}))
    picks = Picks(r)
    with pytest.raises(PrefillRejectedError):
        await _decode_leg(COORDINATORS[name](r.env), deferred(picks))
    assert picks.told == []
    r.assert_nothing_left()


@pytest.mark.parametrize("name", ["nixl", "kv-pool"])
async def test_a_decode_pick_that_finds_nothing_fails_the_hand_off(name: str) -> None:
    r = rig(KV_ANSWER)
    picks = Picks(r, error=NoEndpointError("nothing can decode", code="no_decode_endpoint"))
    with pytest.raises(NoEndpointError):
        await _decode_leg(COORDINATORS[name](r.env), deferred(picks))
    assert picks.told == [PREFILL]
    r.assert_nothing_left()


@pytest.mark.parametrize("name", ["sidecar", "concurrent"])
def test_coordinators_whose_legs_meet_at_the_decode_endpoint_never_defer(name: str) -> None:
    r = rig(KV_ANSWER)
    r.env.defer_decode = True
    assert not COORDINATORS[name](r.env).defers
