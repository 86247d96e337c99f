"""LoRA adapters end to end, through a real Envoy and EPP to simulators serving adapters
as vLLM does: requests follow the server where their adapter runs, an adapter is loaded
on demand and later requests stick to it, a full slot table either unloads the least
recently used adapter (placement) or sends the request where it waits least, an
unknown model is a 404 naming it, and each engine's metric dialect steers the picks."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager as ContextManager
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from epp_harness.stack import LocalStack
from tests.e2e.conftest import ephemeral
from tests.support.http import get_json, held, metric_samples, request
from tests.support.wait import quiesce, wait_for

pytestmark = pytest.mark.e2e
BASE = "sim-model"
KEY = "lora-test-key"


def stack_with(tmp: Path, config: str, servers: int, *sim_args: str) -> LocalStack:
    (tmp / "epp.yaml").write_text(config)
    (tmp / "key").write_text(KEY)
    opts = ephemeral(
        servers=servers,
        sim_args=list(sim_args),
        epp_args=["--config", str(tmp / "epp.yaml"), "--admin-api-key-file", str(tmp / "key")],
    )
    return LocalStack(opts)


def complete(url: str, model: str, max_tokens: int = 2, **headers: str) -> tuple[int, str, Any]:
    """(status, x-sim-instance, JSON body) of one completion sent to ``url``."""
    body = orjson.dumps({"model": model, "prompt": f"hello from {model}", "max_tokens": max_tokens})
    status, h, raw = request(f"{url}/v1/completions", body, headers=headers)
    return status, h.get("x-sim-instance", ""), orjson.loads(raw) if raw else None


def busy(url: str, model: str, max_tokens: int, count: int = 1) -> list[threading.Thread]:
    """``count`` long requests sent straight to one simulator (the EPP does not see them:
    only the server's own metrics tell)."""
    threads = [
        threading.Thread(target=complete, args=(url, model, max_tokens)) for _ in range(count)
    ]
    for t in threads:
        t.start()
    return threads


def held_on(url: str, model: str, max_tokens: int, count: int = 1) -> ContextManager[None]:
    """``count`` long requests sent straight to one simulator (unseen by the EPP), given
    up when the block ends."""
    body = orjson.dumps({"model": model, "prompt": f"held for {model}", "max_tokens": max_tokens})
    return held(url, "/v1/completions", [body] * count)


def reported(stack: LocalStack, index: int, name: str) -> float:
    """What the EPP last heard from simulator ``index`` (epp_endpoint_* gauges)."""
    samples = metric_samples(f"{stack.epp_http_url}/metrics", name)
    return samples.get(f'{name}{{endpoint="{stack.sim_addresses[index]}"}}', 0.0)


def epp_running(stack: LocalStack, index: int) -> float:
    """Running requests the EPP last heard simulator ``index`` report (GET /status)."""
    for member in get_json(f"{stack.epp_http_url}/status")["endpoints"]:
        if member["instance"] == stack.sim_addresses[index]:
            return float((member.get("load") or {}).get("running") or 0.0)
    return 0.0


def lora_newest(url: str) -> dict[str, str]:
    _, _, text = request(f"{url}/metrics")
    series = [
        s
        for f in text_string_to_metric_families(text.decode())
        for s in f.samples
        if s.name == "vllm:lora_requests_info"
    ]
    return dict(max(series, key=lambda s: s.value).labels) if series else {}


# -- affinity and full slots, adapters registered everywhere ---------------------------------

AFFINITY_CONFIG = f"""
models:
  adapters: {{sql: /adapters/sql, chat: /adapters/chat, code: /adapters/code}}
  baseModels: [{BASE}]
"""


@pytest.fixture(scope="module")
def registered(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    tmp = tmp_path_factory.mktemp("lora-affinity")
    with stack_with(
        tmp, AFFINITY_CONFIG, 3,
        "--max-loras", "1", "--max-num-seqs", "1", "--decode-ms-per-token", "20",
        "--lora-modules", "sql=/adapters/sql", "chat=/adapters/chat", "code=/adapters/code",
    ) as s:  # fmt: skip
        yield s


def test_requests_follow_the_server_where_their_adapter_runs(registered: LocalStack) -> None:
    s = registered
    home = s.sim_urls[1]
    threads = busy(home, "sql", 150)  # ~3 s of decode on sim-1, unseen by the EPP
    try:
        wait_for(lambda: lora_newest(home).get("running_lora_adapters") == "sql", 5, "sql runs")
        wait_for(lambda: epp_running(s, 1) >= 1, 5, "the EPP hears it")
        # chat finds sim-1's only adapter slot taken by sql: it goes where a slot is free.
        # (Asked first, while the busy request surely runs: the sql requests below queue
        # behind it and return only once it has ended, when sim-1's slot is free again.)
        served = {complete(s.envoy_url, "chat")[1] for _ in range(4)}
        assert s.sims[1].info["instance"] not in served
        # sim-1 is busy (its one sequence slot taken) yet sql's requests follow the adapter
        served = {complete(s.envoy_url, "sql")[1] for _ in range(3)}
        assert served == {s.sims[1].info["instance"]}
    finally:
        for t in threads:
            t.join()


def test_with_every_slot_busy_the_request_goes_where_it_waits_least(
    registered: LocalStack,
) -> None:
    s = registered
    with ExitStack() as busy_now:
        busy_now.enter_context(held_on(s.sim_urls[0], "sql", 150))  # running, nothing queued
        busy_now.enter_context(held_on(s.sim_urls[1], "chat", 150, count=3))  # running + 2 waiting
        busy_now.enter_context(held_on(s.sim_urls[2], "sql", 150, count=3))  # running + 2 waiting
        wait_for(lambda: reported(s, 1, "epp_endpoint_queue_depth") >= 2, 5, "sim-1 queue")
        wait_for(lambda: reported(s, 2, "epp_endpoint_queue_depth") >= 2, 5, "sim-2 queue")
        wait_for(lambda: epp_running(s, 0) >= 1, 5, "sim-0 running")
        # code is active nowhere and every slot is busy: the shortest wait is sim-0's
        status, instance, _ = complete(s.envoy_url, "code")
        assert status == 200 and instance == s.sims[0].info["instance"]


def test_a_model_nobody_serves_is_a_404_naming_it(registered: LocalStack) -> None:
    status, instance, body = complete(registered.envoy_url, "nope")
    assert status == 404 and instance == ""
    assert body["error"]["code"] == "model_not_found"
    assert "'nope'" in body["error"]["message"]
    assert complete(registered.envoy_url, BASE)[0] == 200  # the base model is served


def test_a_rewrite_header_sends_the_request_to_the_adapter(registered: LocalStack) -> None:
    status, instance, body = complete(
        registered.envoy_url, "anything", **{"x-llm-d-model-name-rewrite": "chat"}
    )
    assert status == 200 and body["model"] == "chat"
    url = next(u for u, p in zip(registered.sim_urls, registered.sims, strict=True)
               if p.info["instance"] == instance)  # fmt: skip
    seen = get_json(f"{url}/sim/last-request")
    assert seen["body"]["model"] == "chat"  # the body was rewritten
    assert "x-llm-d-model-name-rewrite" not in seen["headers"]  # and the header removed


# -- placement: adapters loaded on demand -----------------------------------------------------

PLACEMENT_CONFIG = """
models:
  adapters: {a: /adapters/a, b: /adapters/b, c: /adapters/c}
  rewrites: {canary: {a: 1, b: 1}}
loraPlacement: {enabled: true, unloadLeastRecentlyUsed: true, maxAdaptersPerServer: 1}
"""


@pytest.fixture(scope="module")
def on_demand(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    tmp = tmp_path_factory.mktemp("lora-placement")
    with stack_with(tmp, PLACEMENT_CONFIG, 2, "--enable-lora", "--max-loras", "1") as s:
        yield s


def adapters_on(url: str) -> list[str]:
    return [c["id"] for c in get_json(f"{url}/v1/models")["data"] if c.get("parent")]


def epp_counter(stack: LocalStack, name: str) -> float:
    quiesce(stack)
    return metric_samples(f"{stack.epp_http_url}/metrics", name).get(name, 0.0)


def test_load_on_demand_then_stick_then_unload_the_least_recently_used(
    on_demand: LocalStack,
) -> None:
    s = on_demand
    assert [adapters_on(u) for u in s.sim_urls] == [[], []]
    status, first, body = complete(s.envoy_url, "a")
    assert status == 200 and body["model"] == "a"
    holder = next(i for i, sim in enumerate(s.sims) if sim.info["instance"] == first)
    assert adapters_on(s.sim_urls[holder]) == ["a"] and adapters_on(s.sim_urls[1 - holder]) == []
    assert {complete(s.envoy_url, "a")[1] for _ in range(4)} == {first}  # it sticks
    assert epp_counter(s, 'epp_lora_adapter_loads_total{result="ok"}') == 1
    assert epp_counter(s, "epp_lora_requests_waited_for_load_total") == 1
    # b goes to the server with room
    status, second, _ = complete(s.envoy_url, "b")
    assert status == 200 and second != first
    assert adapters_on(s.sim_urls[1 - holder]) == ["b"]
    complete(s.envoy_url, "a")  # a is now more recently used than b
    # c: both servers full; the least loaded one unloads its adapter first
    status, _, _ = complete(s.envoy_url, "c")
    assert status == 200
    assert epp_counter(s, 'epp_lora_adapter_unloads_total{result="ok"}') == 1
    held = sorted(adapters_on(u)[0] for u in s.sim_urls)
    assert "c" in held and len(held) == 2
    listing = get_json(f"{s.epp_http_url}/lora/adapters")
    assert listing["placement"] is True and sorted(listing["catalogue"]) == ["a", "b", "c"]
    assert sorted(a for v in listing["servers"].values() for a in v) == held


def test_admin_api_loads_and_unloads_with_the_key(on_demand: LocalStack) -> None:
    s = on_demand
    url, target = s.epp_http_url, s.sim_addresses[0]
    doc = orjson.dumps({"adapter": "b", "instance": target})
    status, _, body = request(f"{url}/lora/load", doc)
    assert status == 401
    status, _, body = request(f"{url}/lora/load", doc, headers={"X-Api-Key": "wrong"})
    assert status == 403
    status, _, body = request(f"{url}/lora/load", doc, headers={"X-Api-Key": KEY})
    assert status == 200, body
    assert "b" in adapters_on(s.sim_urls[0])
    status, _, body = request(f"{url}/lora/unload", doc, headers={"X-Api-Key": KEY})
    assert status == 200 and "b" not in adapters_on(s.sim_urls[0])
    bad = orjson.dumps({"adapter": "zzz", "instance": target})
    status, _, body = request(f"{url}/lora/load", bad, headers={"X-Api-Key": KEY})
    assert status == 404 and "not in models.adapters" in orjson.loads(body)["error"]["message"]
    nowhere = orjson.dumps({"adapter": "b", "instance": "10.9.9.9:1"})
    status, _, _ = request(f"{url}/lora/load", nowhere, headers={"X-Api-Key": KEY})
    assert status == 404


def test_a_weighted_rewrite_splits_between_adapters(on_demand: LocalStack) -> None:
    models = {complete(on_demand.envoy_url, "canary")[2]["model"] for _ in range(16)}
    assert models == {"a", "b"}


# -- engine dialects -------------------------------------------------------------------------


# The picks do not depend on the dialect once it is read: each engine's metric names are
# checked on real pages (tests/unit/epp/datalayer/test_prometheus.py), the simulator's
# dialects in tests/integration/epp_harness/sim/test_lora.py and dataLayer.engine in
# tests/unit/epp/test_config.py; the other two dialects end to end are in the slow tier.
@pytest.mark.parametrize(
    "engine", ["vllm", *(pytest.param(e, marks=pytest.mark.slow) for e in ("sglang", "trtllm"))]
)
def test_each_metric_dialect_steers_the_picks(tmp_path: Path, engine: str) -> None:
    config = f"dataLayer: {{engine: {engine}}}\n"
    sim_args = ("--metrics-dialect", engine, "--max-num-seqs", "1", "--decode-ms-per-token", "20")
    with (
        stack_with(tmp_path, config, 2, *sim_args) as s,
        held_on(s.sim_urls[0], BASE, 150, count=3),
    ):
        # 1 running and 2 queued on sim-0, unseen by the EPP but in sim-0's metrics
        wait_for(lambda: reported(s, 0, "epp_endpoint_queue_depth") >= 2, 5, "the queue")
        served = {complete(s.envoy_url, BASE)[1] for _ in range(6)}
        assert served == {s.sims[1].info["instance"]}
