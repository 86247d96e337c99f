"""Admin API body parsing, the EDS assignment and stream, and the state file."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from envoy.config.endpoint.v3.endpoint_pb2 import ClusterLoadAssignment
from envoy.service.discovery.v3.discovery_pb2 import DiscoveryRequest, DiscoveryResponse

from epp.admin.instances import BadInput, parse_body
from epp.common import statefile
from epp.datastore import Datastore
from epp.types import Endpoint, Role
from epp.xds.eds import EDS_TYPE_URL, MODEL_CLUSTER, EdsServer, EnvoySync, load_assignment


def test_body_forms_accepted() -> None:
    role, eps = parse_body(b'{"type": "prefill", "instance": "10.0.0.1:8000"}')
    assert role is Role.PREFILL and [e.address for e in eps] == ["10.0.0.1:8000"]
    role, eps = parse_body(b'{"type": "both", "instances": ["10.0.0.1:1", "[::1]:2"]}')
    assert role is Role.BOTH and [e.address for e in eps] == ["10.0.0.1:1", "[::1]:2"]
    _, eps = parse_body(b'{"type": "decode", "instances": "10.0.0.1:3"}')
    assert eps[0].role is Role.DECODE and eps[0].engine == "vllm"
    _, eps = parse_body(b'{"type": "decode", "instance": "10.0.0.1:3", "engine": "sglang"}')
    assert eps[0].engine == "sglang"
    _, eps = parse_body(b'{"type": "decode", "instance": "10.0.0.1:3"}', engine="trtllm")
    assert eps[0].engine == "trtllm"  # the default is dataLayer.engine


@pytest.mark.parametrize(
    ("body", "code", "words"),
    [
        (b"{bad", "invalid_json", "not valid JSON"),
        (b"[1]", "invalid_body", "JSON object"),
        (b'{"instance": "10.0.0.1:1"}', "missing_type", "'type' is required"),
        (b'{"type": "x", "instance": "10.0.0.1:1"}', "invalid_type", "unknown role 'x'"),
        (b'{"type": "decode"}', "missing_instance", "exactly one"),
        (b'{"type": "decode", "instance": "a", "instances": []}', "missing_instance", "exactly"),
        (b'{"type": "decode", "instances": []}', "invalid_instances", "non-empty"),
        (b'{"type": "decode", "instances": [1]}', "invalid_instances", "non-empty"),
        (b'{"type": "decode", "instance": "10.0.0.1"}', "invalid_instance", "host:port"),
        (b'{"type": "decode", "instance": "10.0.0.1:0"}', "invalid_instance", "1-65535"),
        (b'{"type": "decode", "instance": "ho_st:80"}', "invalid_instance", "host name"),
        (b'{"type": "decode", "instance": "0.0.0.0:80"}', "invalid_instance", "127.0.0.1"),
        (b'{"type": "decode", "instance": "[::]:80"}', "invalid_instance", "any address"),
        (b'{"type": "decode", "instance": "a:1", "engine": "tgi"}', "invalid_engine", "sglang"),
        (b'{"type": "decode", "instance": "a:1", "engine": 1}', "invalid_engine", "got 1"),
    ],
)
def test_bad_bodies_say_what_is_wrong(body: bytes, code: str, words: str) -> None:
    with pytest.raises(BadInput) as info:
        parse_body(body)
    assert info.value.code == code and words in str(info.value)


def _assignment(ds: Datastore) -> dict[str, int]:
    cla = load_assignment(MODEL_CLUSTER, ds.members())
    out = {}
    for group in cla.endpoints:
        for e in group.lb_endpoints:
            sa = e.endpoint.address.socket_address
            out[f"{sa.address}:{sa.port_value}"] = int(e.health_status)
    return out


def test_assignment_mirrors_member_status() -> None:
    ds = Datastore()
    for port in (1, 2, 3, 4):
        ds.add(Endpoint("10.0.0.1", port))
    ds.add(Endpoint("10.0.0.1", 5), waiting=True)
    ds.eject("10.0.0.1:2")
    ds.acquire("10.0.0.1:3")
    ds.remove("10.0.0.1:3")
    health = _assignment(ds)
    assert health == {"10.0.0.1:1": 1, "10.0.0.1:2": 2, "10.0.0.1:3": 3, "10.0.0.1:4": 1}
    # HEALTHY=1, UNHEALTHY=2, DRAINING=3; the waiting one is not listed


async def test_eds_stream_pushes_every_change_and_ends_with_its_requests() -> None:
    ds = Datastore()
    ds.add(Endpoint("10.0.0.1", 1))
    eds = EdsServer(ds)
    requests: asyncio.Queue[DiscoveryRequest | None] = asyncio.Queue()

    async def incoming() -> AsyncIterator[DiscoveryRequest]:
        while (r := await requests.get()) is not None:
            yield r

    responses = eds.stream(incoming())
    await requests.put(DiscoveryRequest(type_url=EDS_TYPE_URL, resource_names=[MODEL_CLUSTER]))
    first = await asyncio.wait_for(anext(responses), 5)
    assert _hosts(first) == ["10.0.0.1:1"]
    assert not eds.sync.synced  # sent, not yet acknowledged
    await requests.put(
        DiscoveryRequest(response_nonce=first.nonce, version_info=first.version_info)
    )
    await asyncio.wait_for(eds.sync.wait(), 5)
    assert eds.sync.synced
    ds.add(Endpoint("10.0.0.2", 2))
    second = await asyncio.wait_for(anext(responses), 5)
    assert _hosts(second) == ["10.0.0.1:1", "10.0.0.2:2"]
    assert second.version_info != first.version_info and second.nonce != first.nonce
    await requests.put(None)  # Envoy hangs up
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(anext(responses), 5)


async def test_a_rejected_eds_update_is_no_acknowledgement() -> None:
    eds = EdsServer(Datastore(), sync=EnvoySync(wait_s=0.05))
    requests: asyncio.Queue[DiscoveryRequest | None] = asyncio.Queue()

    async def incoming() -> AsyncIterator[DiscoveryRequest]:
        while (r := await requests.get()) is not None:
            yield r

    responses = eds.stream(incoming())
    await requests.put(DiscoveryRequest(type_url=EDS_TYPE_URL))
    first = await asyncio.wait_for(anext(responses), 5)
    nack = DiscoveryRequest(response_nonce=first.nonce)
    nack.error_detail.message = "rejected"
    await requests.put(nack)
    await requests.put(None)
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(anext(responses), 5)
    assert not eds.sync.synced
    await eds.sync.wait()  # gives up after wait_s, and never waits again
    assert eds.sync.synced


async def test_eds_close_ends_open_streams() -> None:
    eds = EdsServer(Datastore())
    requests: asyncio.Queue[DiscoveryRequest] = asyncio.Queue()

    async def incoming() -> AsyncIterator[DiscoveryRequest]:
        while True:
            yield await requests.get()

    responses = eds.stream(incoming())
    await requests.put(DiscoveryRequest(type_url=EDS_TYPE_URL))
    assert _hosts(await asyncio.wait_for(anext(responses), 5)) == []
    eds.close()
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(anext(responses), 5)


def _hosts(response: DiscoveryResponse) -> list[str]:
    cla = ClusterLoadAssignment()
    assert response.type_url == EDS_TYPE_URL and response.resources[0].Unpack(cla)
    return [
        f"{e.endpoint.address.socket_address.address}:{e.endpoint.address.socket_address.port_value}"
        for g in cla.endpoints
        for e in g.lb_endpoints
    ]


def test_state_file_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    eps = [Endpoint("10.0.0.1", 1, Role.PREFILL, engine="sglang"), Endpoint("::1", 2)]
    statefile.save(path, eps)
    # each endpoint keeps its own engine; an entry without one gets the default
    assert statefile.load(path, "trtllm") == [
        Endpoint("10.0.0.1", 1, Role.PREFILL, engine="sglang"),
        Endpoint("::1", 2, engine="vllm"),
    ]
    path.write_bytes(b'{"version": 1, "instances": [{"instance": "10.0.0.1:3"}]}')
    assert statefile.load(path, "trtllm") == [Endpoint("10.0.0.1", 3, engine="trtllm")]
    assert not list(tmp_path.glob(".ready-*"))  # no temporary left behind
    assert statefile.load(tmp_path / "missing.json", "vllm") == []


@pytest.mark.parametrize(
    "content",
    [
        b"{not json",
        b"[]",
        b'{"version": 2, "instances": []}',
        b'{"version": 1, "instances": {}}',
    ],
)
def test_corrupt_state_file_is_reported_and_ignored(
    tmp_path: Path, content: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "state.json"
    path.write_bytes(content)
    with caplog.at_level(logging.ERROR):
        assert statefile.load(path, "vllm") == []
    assert "corrupt" in caplog.text and str(path) in caplog.text


async def test_admin_port_answers_unknown_paths_and_wrong_methods_in_json() -> None:
    import aiohttp
    from aiohttp.test_utils import TestServer

    from epp.admin.http import make_admin_app
    from epp.datastore import Datastore
    from epp.observability.metrics import EppMetrics

    ds = Datastore()
    app = make_admin_app(ds, EppMetrics(ds), ready=lambda: True)
    async with TestServer(app) as server, aiohttp.ClientSession() as session:
        for method, path, status in (("GET", "/nope", 404), ("POST", "/metrics", 405)):
            async with session.request(method, server.make_url(path)) as resp:
                assert resp.status == status
                doc = await resp.json()
                assert path in doc["error"]["message"]
                assert doc["error"]["code"] in ("not_found", "method_not_allowed")


def test_state_file_keeps_good_entries_when_one_is_bad(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "state.json"
    path.write_text(
        '{"version": 1, "instances": [{"instance": "10.0.0.1:8000", "type": "prefill"},'
        ' {"instance": "nowhere"}, {"instance": "10.0.0.2:8000", "type": "chef"},'
        ' {"instance": "10.0.0.3:8000"}]}'
    )
    with caplog.at_level(logging.ERROR):
        loaded = statefile.load(path, "vllm")
    assert "skipping entry {'instance': 'nowhere'}" in caplog.text
    assert [(e.address, e.role.value) for e in loaded] == [
        ("10.0.0.1:8000", "prefill"),
        ("10.0.0.3:8000", "decode"),
    ]


def test_admin_addresses_are_canonical() -> None:
    _, [endpoint] = parse_body(b'{"type": "decode", "instance": "[0:0::1]:8000"}', "vllm")
    assert endpoint.address == "[::1]:8000"
