"""The ext_proc stream with a disaggregated request: the coordinator seam (a fake
coordinator implementing the protocol) decides the decode leg; the stream must apply
it exactly (headers, rewritten body, content-length, chunking, buffered mode) and
release every load claim however the stream ends."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Mapping
from typing import Any

import orjson
import pytest
from envoy.extensions.filters.http.ext_proc.v3.processing_mode_pb2 import ProcessingMode
from envoy.service.ext_proc.v3.external_processor_pb2 import ProcessingResponse

from epp.config import build_scheduler
from epp.datastore import Datastore
from epp.disagg.coordinators import DecodeLeg, Handoff
from epp.errors import PrefillRejectedError
from epp.extproc.messages import EMPTY_REQUEST_HEADERS, MAX_CHUNK_BYTES
from epp.extproc.stream import ExtProcStream, Phase
from epp.observability.metrics import EppMetrics
from epp.router import Router
from epp.types import Endpoint, Role
from tests.support import extproc as m

PREFILL, DECODE = Endpoint("10.0.0.1", 8000, Role.PREFILL), Endpoint("10.0.0.2", 8000)
LONG = "a long prompt " * 200  # ~700 tokens: over nonCachedTokens, so disaggregated


class FakeCoordinator:
    """Answers with a canned decode leg, at once or after the test releases it."""

    name = "fake"

    def __init__(self, leg: DecodeLeg | Exception, wait: bool) -> None:
        self.leg = leg
        self.wait = wait
        self.release = asyncio.Event()
        self.handoffs: list[Handoff] = []

    def hand_off(self, handoff: Handoff) -> Any:
        self.handoffs.append(handoff)
        if not self.wait:
            if isinstance(self.leg, Exception):
                raise self.leg
            return self.leg
        return self._later()

    async def _later(self) -> DecodeLeg:
        await self.release.wait()
        if isinstance(self.leg, Exception):
            raise self.leg
        return self.leg

    async def close(self) -> None:
        pass


def router(coordinator: FakeCoordinator) -> Router:
    ds = Datastore()
    ds.add(PREFILL)
    ds.add(DECODE)
    return Router(
        ds, build_scheduler(""), EppMetrics(ds),
        max_body_bytes=1 << 22, rng=random.Random(0), coordinator=coordinator,
    )  # fmt: skip


def body(prompt: str = LONG, **extra: Any) -> bytes:
    return orjson.dumps({"model": "m", "prompt": prompt, "max_tokens": 5, **extra})


async def replies_for(stream: ExtProcStream, payload: bytes, **headers: Any) -> Any:
    assert m.replies(stream.on_message(m.request_headers(**headers))) == []
    return await m.settle(stream, stream.on_message(m.request_body(payload, True)))


def decoded(replies: list[ProcessingResponse]) -> Mapping[str, Any]:
    data, end = m.streamed_body(replies[1:])
    assert end
    doc: Mapping[str, Any] = orjson.loads(data)
    assert m.set_headers(replies[0])["content-length"] == str(len(data))
    return doc


async def test_rewritten_body_replaces_the_clients_with_its_length() -> None:
    leg = DecodeLeg(doc={"model": "m", "prompt": LONG, "kv_transfer_params": {"x": 1}})
    coord = FakeCoordinator(leg, wait=True)
    r = router(coord)
    stream = ExtProcStream(r)
    pending = asyncio.ensure_future(replies_for(stream, body()))
    await asyncio.sleep(0)
    assert not pending.done()  # held while the prefill leg runs
    assert r.datastore.in_flight(DECODE.address) == 1
    coord.release.set()
    replies = await pending
    assert m.set_headers(replies[0])["x-gateway-destination-endpoint"] == DECODE.address
    assert decoded(replies)["kv_transfer_params"] == {"x": 1}
    [h] = coord.handoffs
    assert (h.prefill, h.decode) == (PREFILL, DECODE)
    assert stream.phase is Phase.UPSTREAM


async def test_big_rewritten_body_is_chunked_for_envoy() -> None:
    big = "y" * (2 * MAX_CHUNK_BYTES + 5)
    coord = FakeCoordinator(DecodeLeg(doc={"model": "m", "prompt": big}), wait=False)
    replies = await replies_for(ExtProcStream(router(coord)), body())
    assert all(
        len(r.request_body.response.body_mutation.streamed_response.body) <= MAX_CHUNK_BYTES
        for r in replies[1:]
    )
    assert decoded(replies)["prompt"] == big


async def test_headers_only_leg_keeps_the_body_and_holds_the_prefill_claim() -> None:
    coord = FakeCoordinator(DecodeLeg(), wait=False)
    r = router(coord)
    coord.leg = DecodeLeg(
        headers=(("x-prefiller-host-port", PREFILL.address),),
        prefill_ticket=r.datastore.acquire(PREFILL.address, 10),
    )
    stream = ExtProcStream(r)
    payload = body()
    replies = await replies_for(stream, payload)
    assert m.set_headers(replies[0])["x-prefiller-host-port"] == PREFILL.address
    assert m.streamed_body(replies[1:]) == (payload, True)
    assert r.datastore.in_flight(PREFILL.address) == 1
    stream.on_message(m.response_headers(200, end_of_stream=True))
    assert r.datastore.in_flight(PREFILL.address) == 0
    assert r.datastore.in_flight(DECODE.address) == 0


async def test_prefill_client_error_is_the_clients_answer() -> None:
    upstream = orjson.dumps({"error": {"message": "The model `m` does not exist."}})
    coord = FakeCoordinator(PrefillRejectedError(404, upstream, "rejected"), wait=True)
    r = router(coord)
    stream = ExtProcStream(r)
    pending = asyncio.ensure_future(replies_for(stream, body()))
    await asyncio.sleep(0)
    coord.release.set()
    [reply] = await pending
    assert reply.immediate_response.status.code == 404
    assert reply.immediate_response.body == upstream
    assert r.datastore.in_flight(DECODE.address) == 0
    assert stream.phase is Phase.DONE


async def test_envoy_reset_during_the_prefill_leg_releases_every_claim() -> None:
    """What the transports do when Envoy resets the stream: the awaited replies are
    cancelled, then the stream is closed."""
    coord = FakeCoordinator(DecodeLeg(), wait=True)
    r = router(coord)
    stream = ExtProcStream(r)
    pending = asyncio.ensure_future(replies_for(stream, body()))
    await asyncio.sleep(0)
    assert r.datastore.in_flight(DECODE.address) == 1
    pending.cancel()
    with pytest.raises(asyncio.CancelledError):
        await pending
    stream.close()
    assert r.datastore.in_flight(DECODE.address) == 0


async def test_client_sent_pd_fields_never_reach_a_server() -> None:
    """kv_transfer_params / bootstrap_* steer KV transfers: only the EPP sets them."""
    coord = FakeCoordinator(DecodeLeg(), wait=False)
    forged = body(prompt="hi", kv_transfer_params={"remote_host": "evil"}, bootstrap_room=1)
    replies = await replies_for(ExtProcStream(router(coord)), forged)
    assert coord.handoffs == []  # short: decode only, but the body is still cleaned
    doc = decoded(replies)
    assert "kv_transfer_params" not in doc and "bootstrap_room" not in doc
    assert doc["prompt"] == "hi"
    coord = FakeCoordinator(DecodeLeg(), wait=False)
    await replies_for(ExtProcStream(router(coord)), body(kv_transfer_params={"x": 1}))
    [h] = coord.handoffs  # disaggregated: the coordinator starts from the cleaned body
    assert "kv_transfer_params" not in h.doc


async def test_short_prompt_never_reaches_the_coordinator() -> None:
    coord = FakeCoordinator(DecodeLeg(doc={"never": "used"}), wait=False)
    payload = body(prompt="hi")
    replies = await replies_for(ExtProcStream(router(coord)), payload)
    assert coord.handoffs == []
    assert m.streamed_body(replies[1:]) == (payload, True)


@pytest.mark.parametrize("rewrite", [True, False])
async def test_buffered_mode_replaces_the_body_only_when_rewritten(rewrite: bool) -> None:
    new = {"model": "m", "prompt": LONG, "kv_transfer_params": {"k": 2}}
    coord = FakeCoordinator(DecodeLeg(doc=new if rewrite else None), wait=False)
    stream = ExtProcStream(router(coord))
    first = stream.on_message(m.request_headers(request_body_mode=ProcessingMode.BUFFERED))
    assert m.replies(first) == [EMPTY_REQUEST_HEADERS]
    [reply] = m.replies(stream.on_message(m.request_body(body(), True)))
    common = reply.request_body.response
    headers = {
        h.header.key: h.header.raw_value.decode() for h in common.header_mutation.set_headers
    }
    if rewrite:
        assert orjson.loads(common.body_mutation.body) == new
        assert headers["content-length"] == str(len(common.body_mutation.body))
    else:
        assert not common.HasField("body_mutation")
        assert "content-length" not in headers


def test_bootstrap_port_label_then_config_then_own_port() -> None:
    from epp.disagg.coordinators import _bootstrap_port

    labelled = Endpoint("10.0.0.9", 8000, Role.PREFILL, {"bootstrap-port": "8998"})
    assert _bootstrap_port(labelled, 9000) == 8998
    assert _bootstrap_port(PREFILL, 9000) == 9000
    assert _bootstrap_port(PREFILL, None) == PREFILL.port
