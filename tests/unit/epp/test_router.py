"""The router's deferred decode selection, driven through an ext_proc stream with the
real `nixl` coordinator and prefill servers in memory (tests/support/legs.py): the
request holds a pending claim while its prefill leg runs, the decode endpoint is picked
from the snapshot of the moment the leg ends, the claim moves there, and every way out
(a rejected or failed leg, no decode endpoint left, a client that leaves) brings the
accounting back to zero."""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
from envoy.service.ext_proc.v3.external_processor_pb2 import ProcessingResponse

from epp.common.requestparse import parse_request
from epp.config import build_scheduler
from epp.datastore import Datastore
from epp.disagg.coordinators import CoordinatorEnv, NixlCoordinator
from epp.disagg.legs import LegClient
from epp.extproc.stream import ExtProcStream, Phase
from epp.observability.metrics import EppMetrics
from epp.router import Router
from epp.types import Endpoint, EndpointMetrics, InferenceRequest, Role
from tests.support import extproc as m
from tests.support.legs import Handler, MemoryLegTransport, answer, held

PREFILL = Endpoint("10.0.0.1", 8000, Role.PREFILL)
DECODES = (Endpoint("10.0.0.2", 8000, Role.DECODE), Endpoint("10.0.0.3", 8000, Role.DECODE))
LONG = "a long prompt " * 200  # ~700 tokens: over nonCachedTokens, so disaggregated
KV = {"remote_engine_id": "e1", "remote_block_ids": [1, 2], "remote_host": "10.0.0.1"}
KV_ANSWER = answer(200, {"choices": [{"text": "x"}], "kv_transfer_params": KV})


@dataclass
class Rig:
    datastore: Datastore
    metrics: EppMetrics
    router: Router
    transport: MemoryLegTransport

    def load(self, address: str, waiting: float) -> None:
        """A fresh load report for ``address``."""
        report = EndpointMetrics(time.monotonic(), waiting=waiting, running=1, kv_usage=0.1)
        self.datastore.update_metrics(address, report)

    def picks(self, pick: str) -> float:
        value = self.metrics.registry.get_sample_value(
            "epp_deferred_decode_picks_total", {"pick": pick}
        )
        return value or 0.0

    def assert_nothing_left(self) -> None:
        ds = self.datastore
        assert ds.pending == 0
        assert [ds.in_flight(e.address) for e in (PREFILL, *DECODES)] == [0, 0, 0]
        assert self.transport.open == 0


def rig(prefill: Handler | None, *, defer: bool = True) -> Rig:
    ds = Datastore()
    for endpoint in (PREFILL, *DECODES):
        ds.add(endpoint)
    metrics = EppMetrics(ds)
    transport = MemoryLegTransport({PREFILL.address: prefill} if prefill else {})
    env = CoordinatorEnv(ds, metrics, LegClient(transport), random.Random(1), defer_decode=defer)
    router = Router(
        ds, build_scheduler(""), metrics, max_body_bytes=1 << 22,
        rng=random.Random(0), coordinator=NixlCoordinator(env),
    )  # fmt: skip
    r = Rig(ds, metrics, router, transport)
    for decode in DECODES:
        r.load(decode.address, waiting=0)
    return r


def parse(prompt: str) -> InferenceRequest:
    body = orjson.dumps({"model": "m", "prompt": prompt, "max_tokens": 5})
    request, _doc = parse_request("r-1", {":path": "/v1/completions"}, body)
    return request


def start(stream: ExtProcStream, prompt: str = LONG) -> asyncio.Future[Any]:
    """The request's replies, as the transport awaits them."""
    payload = orjson.dumps({"model": "m", "prompt": prompt, "max_tokens": 5})
    assert m.replies(stream.on_message(m.request_headers())) == []
    out = stream.on_message(m.request_body(payload, True))
    assert out.wait is not None, "a deferred request waits for its prefill leg"
    return asyncio.ensure_future(m.settle(stream, out))


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def destination(replies: list[ProcessingResponse]) -> str:
    return m.set_headers(replies[0])["x-gateway-destination-endpoint"]


def sent_body(replies: list[ProcessingResponse]) -> dict[str, Any]:
    data, end = m.streamed_body(replies[1:])
    assert end
    doc: dict[str, Any] = orjson.loads(data)
    return doc


async def test_the_decode_endpoint_is_picked_when_the_prefill_leg_ends() -> None:
    """The first pick becomes busy while the prefill runs: the pick after the leg takes
    the other decode endpoint, and the request's claim lands there, not before."""
    release = asyncio.Event()
    r = rig(held(release, KV_ANSWER))
    stream = ExtProcStream(r.router)
    pending = start(stream)
    await settle()
    routed = stream._req.routed
    assert routed is not None and routed.deferred is not None
    first = routed.result.primary.address
    other = next(d.address for d in DECODES if d.address != first)
    # while the leg runs: the prefill endpoint holds the leg, no decode endpoint a claim
    assert r.datastore.pending == 1
    assert [r.datastore.in_flight(d.address) for d in DECODES] == [0, 0]
    assert r.datastore.in_flight(PREFILL.address) == 1
    r.load(first, waiting=10)  # full: its queue is past queueDepthThreshold
    release.set()
    replies = await pending
    assert destination(replies) == other
    assert sent_body(replies)["kv_transfer_params"] == KV
    assert r.datastore.pending == 0
    assert (r.datastore.in_flight(other), r.datastore.in_flight(first)) == (1, 0)
    assert (r.picks("moved"), r.picks("same")) == (1, 0)
    assert routed.deferred is None and routed.ticket.address == other
    stream.on_message(m.response_headers(200, end_of_stream=True))
    r.assert_nothing_left()


async def test_the_pick_leaves_out_the_endpoint_that_prefilled() -> None:
    """A prefill-decode endpoint that ran the leg is not the decode endpoint, even when
    it is the least loaded by then: its KV goes to another one."""
    both = Endpoint("10.0.0.9", 8000, Role.BOTH)
    release = asyncio.Event()
    r = rig(None)
    r.datastore.remove(PREFILL.address)
    r.datastore.add(both)
    r.transport.servers[both.address] = held(release, KV_ANSWER)
    r.load(both.address, waiting=3)  # busier than the decode endpoints: it prefills
    stream = ExtProcStream(r.router)
    pending = start(stream)
    await settle()
    routed = stream._req.routed
    assert routed is not None and routed.result.prefill == both
    r.load(both.address, waiting=0)  # the least loaded of all by the end of the leg
    for decode in DECODES:
        r.load(decode.address, waiting=4)
    release.set()
    replies = await pending
    assert destination(replies) in {d.address for d in DECODES}
    stream.on_message(m.response_headers(200, end_of_stream=True))
    assert r.datastore.in_flight(both.address) == 0
    r.assert_nothing_left()


async def test_a_prefill_server_that_cannot_be_reached_means_decode_alone_where_picked() -> None:
    r = rig(None)  # nothing answers on PREFILL
    stream = ExtProcStream(r.router)
    replies = await start(stream)
    assert destination(replies) in {d.address for d in DECODES}
    assert "kv_transfer_params" not in sent_body(replies)
    assert r.datastore.in_flight(destination(replies)) == 1
    assert r.picks("moved") + r.picks("same") == 1
    stream.on_message(m.response_headers(200, end_of_stream=True))
    r.assert_nothing_left()


async def test_a_rejected_prefill_answers_the_client_and_releases_the_pending_claim() -> None:
    r = rig(answer(400, {"error": {"message": "prompt too long"}}))
    stream = ExtProcStream(r.router)
    [reply] = await start(stream)
    assert reply.immediate_response.status.code == 400
    assert stream.phase is Phase.DONE
    assert r.picks("moved") + r.picks("same") + r.picks("none") == 0
    r.assert_nothing_left()


async def test_no_decode_endpoint_after_the_leg_is_a_503_and_nothing_is_held() -> None:
    release = asyncio.Event()
    r = rig(held(release, KV_ANSWER))
    stream = ExtProcStream(r.router)
    pending = start(stream)
    await settle()
    for decode in DECODES:  # both leave the pool during the prefill
        r.datastore.remove(decode.address)
    release.set()
    [reply] = await pending
    assert reply.immediate_response.status.code == 503
    error = orjson.loads(reply.immediate_response.body)["error"]
    assert error["code"] == "no_decode_endpoint"
    assert error["type"] == "service_unavailable"
    assert error["message"].startswith("no endpoint can decode the request after its prefill")
    assert r.picks("none") == 1
    r.assert_nothing_left()


async def test_a_client_that_leaves_during_the_prefill_leg_leaves_nothing_held() -> None:
    r = rig(held(asyncio.Event(), KV_ANSWER))  # never answers
    stream = ExtProcStream(r.router)
    pending = start(stream)
    await settle()
    assert r.datastore.pending == 1 and r.transport.open == 1
    pending.cancel()  # what the transports do when Envoy resets the stream
    with pytest.raises(asyncio.CancelledError):
        await pending
    stream.close()
    await settle()
    r.assert_nothing_left()
    assert r.picks("moved") + r.picks("same") == 0


def test_a_pick_after_the_request_ended_claims_nothing() -> None:
    """The leg ended just as the client left: the pick runs, but takes no claim."""
    r = rig(KV_ANSWER)
    request = parse(LONG)
    routed = r.router.route(request)
    assert routed.deferred is not None and r.datastore.pending == 1
    routed.release()
    assert r.router.pick_decode(routed, request, PREFILL) in DECODES
    r.assert_nothing_left()


async def test_without_deferral_the_decode_endpoint_is_claimed_up_front() -> None:
    release = asyncio.Event()
    r = rig(held(release, KV_ANSWER), defer=False)
    stream = ExtProcStream(r.router)
    pending = start(stream)
    await settle()
    routed = stream._req.routed
    assert routed is not None and routed.deferred is None
    assert r.datastore.pending == 0
    assert r.datastore.in_flight(routed.result.primary.address) == 1
    release.set()
    assert destination(await pending) == routed.result.primary.address
    stream.on_message(m.response_headers(200, end_of_stream=True))
    r.assert_nothing_left()
