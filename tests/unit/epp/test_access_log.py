"""The access log observer (``epp serve --access-log``) through a real ext_proc stream:
one line per routing decision, and for a disaggregated request whose decode endpoint
is picked after the prefill leg, one line once that pick is made."""

from __future__ import annotations

import asyncio
import logging
import random

import orjson
import pytest

from epp.config import build_scheduler
from epp.datastore import Datastore
from epp.disagg.coordinators import CoordinatorEnv, NixlCoordinator
from epp.disagg.legs import LegClient
from epp.extproc.stream import ExtProcStream
from epp.lifecycle.observers.accesslog import ACCESS_LOGGER, AccessLog
from epp.observability.metrics import EppMetrics
from epp.types import Endpoint
from tests.support import extproc as m
from tests.support.legs import MemoryLegTransport, held
from tests.support.routers import make_router
from tests.unit.epp.test_router import DECODES, KV_ANSWER, PREFILL, settle, start

BODY = orjson.dumps({"model": "m", "prompt": "hello " * 20, "max_tokens": 4})


def access_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == ACCESS_LOGGER]


def test_a_routed_request_gets_one_line(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    ds = Datastore()
    ds.add(Endpoint("10.0.0.1", 8000))
    ds.add(Endpoint("10.0.0.2", 8000))
    router = make_router(ds, build_scheduler(""), rng=random.Random(0), observers=[AccessLog()])
    stream = ExtProcStream(router, max_destinations=2)
    stream.on_message(m.request_headers({"x-request-id": "r-7"}))
    replies = m.replies(stream.on_message(m.request_body(BODY, True)))
    destination = m.set_headers(replies[0])["x-gateway-destination-endpoint"]
    [line] = access_lines(caplog)
    fields = dict(f.split("=", 1) for f in line.split()[1:])
    assert line.startswith("routed ")
    assert fields["request_id"] == "r-7" and fields["model"] == "m"
    assert fields["endpoints"] == destination and "," in destination  # the whole list
    assert float(fields["scheduling_ms"]) >= 0.0
    stream.on_message(m.response_headers(200, end_of_stream=True))
    stream.close()
    assert len(access_lines(caplog)) == 1  # the response adds nothing


async def test_a_deferred_decode_pick_is_logged_once_it_is_made(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    ds = Datastore()
    for endpoint in (PREFILL, *DECODES):
        ds.add(endpoint)
    metrics = EppMetrics(ds)
    release = asyncio.Event()
    transport = MemoryLegTransport({PREFILL.address: held(release, KV_ANSWER)})
    env = CoordinatorEnv(ds, metrics, LegClient(transport), random.Random(1), defer_decode=True)
    router = make_router(
        ds, build_scheduler(""), metrics, rng=random.Random(0),
        coordinator=NixlCoordinator(env), observers=[AccessLog()],
    )  # fmt: skip
    stream = ExtProcStream(router)
    pending = start(stream)
    await settle()
    assert access_lines(caplog) == []  # the prefill leg runs: no decode endpoint yet
    release.set()
    replies = await pending
    [line] = access_lines(caplog)
    fields = dict(f.split("=", 1) for f in line.split()[1:])
    assert fields["endpoints"] == m.set_headers(replies[0])["x-gateway-destination-endpoint"]
    assert fields["prefill"] == PREFILL.address and fields["decision"] == "disaggregated"
    stream.on_message(m.response_headers(200, end_of_stream=True))
    stream.close()
    await transport.close()
