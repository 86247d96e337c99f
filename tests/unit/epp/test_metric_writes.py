"""How many metric writes one request costs: each llm-d event is written once (both of
the llm-d Router's names come from that write at scrape time), counted by watching
every call into metric storage while one request passes the ext_proc stream."""

from __future__ import annotations

import random
import sys
from collections import Counter as Tally
from collections.abc import Iterator
from contextlib import contextmanager
from types import CodeType, FrameType
from typing import Any

import orjson
from prometheus_client import Counter, Gauge, Histogram, Summary

from epp.config import build_scheduler
from epp.datastore import Datastore
from epp.extproc.stream import ExtProcStream
from epp.observability import families
from epp.observability.metrics import EppMetrics
from epp.types import Endpoint, Role
from tests.support import extproc as m
from tests.support.routers import make_router

# every way a value is written: prometheus_client's (the project's own epp_* series)
# and the cells the llm-d names are rendered from
PROMETHEUS = {
    f.__code__
    for f in (Counter.inc, Gauge.inc, Gauge.dec, Gauge.set, Histogram.observe, Summary.observe)
}
CELLS = {
    f.__code__
    for f in (families.Count.inc, families.Level.inc, families.Level.dec, families.Buckets.observe)
}
USAGE = {"prompt_tokens": 9, "completion_tokens": 4, "prompt_tokens_details": {"cached_tokens": 8}}


@contextmanager
def writes() -> Iterator[Tally[str]]:
    """Counts calls into metric storage, by which storage, while the block runs."""
    tally: Tally[str] = Tally()

    def watch(frame: FrameType, event: str, _: Any) -> None:
        if event == "call":
            code: CodeType = frame.f_code
            if code in PROMETHEUS:
                tally["prometheus"] += 1
            elif code in CELLS:
                tally["llm-d"] += 1

    sys.setprofile(watch)
    try:
        yield tally
    finally:
        sys.setprofile(None)


def test_one_request_writes_each_llmd_event_once() -> None:
    ds = Datastore()
    ds.add(Endpoint("10.0.0.1", 8000, Role.PREFILL))
    ds.add(Endpoint("10.0.0.2", 8000))
    metrics = EppMetrics(ds)
    # a P/D pool: a short prompt is a decode-only decision
    router = make_router(ds, build_scheduler(""), metrics, rng=random.Random(0))
    body = orjson.dumps({"model": "m", "prompt": "hi", "max_tokens": 4})
    with writes() as tally:
        stream = ExtProcStream(router)
        stream.on_message(m.request_headers())
        head = m.replies(stream.on_message(m.request_body(body, True)))[0]  # routed at once
        assert m.set_headers(head)["x-gateway-destination-endpoint"] == "10.0.0.2:8000"
        stream.on_message(m.response_headers(200))
        stream.on_message(m.response_body(orjson.dumps({"usage": USAGE}), True))
        stream.close()
    # llm-d: routed (request, scheduling time, attempt, P/D decision), in flight and
    # out, first byte, completed (duration, input, output and cached tokens, ntpot):
    # 12 writes, where writing every one of the llm-d Router's names cost 25
    assert tally["llm-d"] == 12
    # the project's own: stream opened, closed and counted, scheduling time, routed,
    # P/D decision, flow control's dispatch, response status, prompt and completion
    # tokens
    assert tally["prometheus"] == 10
    value = metrics.registry.get_sample_value
    model = {"model_name": "m", "target_model_name": "m"}
    flow = {**model, "fairness_id": "default-flow", "priority": "0"}
    assert value("llm_d_epp_request_total", flow) == 1
    assert value("inference_objective_request_total", {**model, "priority": "0"}) == 1
    decision = {"model_name": "m", "decision_type": "decode-only"}
    for name in (
        "llm_d_inference_scheduler_pd_decision",
        "llm_d_inference_scheduler_disagg_decision",
    ):
        assert value(f"{name}_total", decision) == 1
    assert value("llm_d_epp_request_cached_tokens_sum", flow) == 8
    assert value("inference_objective_prompt_cached_tokens_sum", model) == 8
    assert value("inference_objective_running_requests", {"model_name": "m"}) == 0
