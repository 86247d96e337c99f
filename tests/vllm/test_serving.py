"""Two real vLLM servers (KV events on) behind Envoy and the EPP: the OpenAI client,
the servers' own metrics and ORCA headers as the EPP reads them, the engine's
tokenization against the committed fixture, and prefix-aware routing measured by
vLLM's own prefix-cache counters."""

from __future__ import annotations

import base64
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from openai import OpenAI

from epp.kvevents.settings import EVENTS_LABEL, REPLAY_LABEL
from epp_harness.stack import LocalStack
from tests.support.http import metric_sum, request
from tests.support.wait import wait_for
from tests.vllm.conftest import epp_stack, round_robin_envoy, status
from tests.vllm.events import EventLog
from tests.vllm.servers import MODEL_NAME, VllmServer, log, model_dir, vllm_servers

pytestmark = pytest.mark.e2e
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "tiny-llama" / "tokenize.json"
HITS = "vllm:prefix_cache_hits_total"
BLOCKS = 64
ROOT = Path(__file__).resolve().parents[2]
FRAMES = ROOT / "tests" / "fixtures" / "vllm-kv-events.json"


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[VllmServer]]:
    workdir = tmp_path_factory.mktemp("vllm-serving")
    # few blocks (64 of 128 tokens), so the KV-event test can make the servers evict
    small = ["--num-gpu-blocks-override", str(BLOCKS)]
    with vllm_servers(workdir, [("vllm-a", small, {}), ("vllm-b", small, {})]) as started:
        yield started


def flags(servers: list[VllmServer]) -> list[str]:
    return [arg for s in servers for arg in ("--endpoint", s.address)]


@pytest.fixture(scope="module")
def stack(
    servers: list[VllmServer], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalStack]:
    with epp_stack(tmp_path_factory.mktemp("epp-default"), flags(servers)) as s:
        yield s


def test_openai_client_through_envoy_and_the_epp(stack: LocalStack) -> None:
    client = OpenAI(base_url=f"{stack.envoy_url}/v1", api_key="unused", max_retries=0)
    done = client.completions.create(model=MODEL_NAME, prompt="hello world", max_tokens=4)
    assert done.choices[0].text and done.usage is not None
    assert done.usage.completion_tokens == 4
    chat = client.chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": "hello"}], max_tokens=4
    )
    assert chat.choices[0].message.content is not None and chat.usage is not None
    pieces = list(
        client.completions.create(model=MODEL_NAME, prompt="the report", max_tokens=5, stream=True)
    )
    assert "".join(p.choices[0].text for p in pieces if p.choices)
    chunks = list(
        client.chat.completions.create(
            model=MODEL_NAME,
            messages=[{"role": "user", "content": "explain the cache"}],
            max_tokens=5,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    in_flight = lambda: metric_sum(  # noqa: E731
        request(f"{stack.epp_http_url}/metrics")[2].decode(), "epp_in_flight_requests"
    )
    wait_for(lambda: in_flight() == 0, what="in-flight back to zero")


def test_the_epp_reads_the_servers_metrics_and_cache_geometry(
    stack: LocalStack, servers: list[VllmServer]
) -> None:
    members = {m["instance"]: m for m in status(stack)["endpoints"]}
    for s in servers:
        text = s.metrics()
        info = next(ln for ln in text.splitlines() if ln.startswith("vllm:cache_config_info{"))
        labels = dict(re.findall(r'(\w+)="([^"]*)"', info))
        load = members[s.address]["load"]
        assert load["block_size"] == int(labels["block_size"]) == 128
        assert load["num_blocks"] == int(labels["num_gpu_blocks"]) == BLOCKS
        assert load["waiting"] == s.metric("vllm:num_requests_waiting") == 0
        wait_for(  # the gauge moves as vLLM frees blocks: the EPP's next scrape agrees
            lambda s=s: (
                load_of(stack, s)["kv_cache_usage"]  # type: ignore[misc]
                == pytest.approx(s.metric("vllm:kv_cache_usage_perc"))
            ),
            what="the same KV-cache usage",
        )
        assert load["age_s"] < 2
    epp_metrics = request(f"{stack.epp_http_url}/metrics")[2].decode()
    for s in servers:
        assert f'epp_endpoint_kv_cache_usage{{endpoint="{s.address}"}}' in epp_metrics


def load_of(stack: LocalStack, server: VllmServer) -> dict[str, Any]:
    members = {m["instance"]: m for m in status(stack)["endpoints"]}
    load: dict[str, Any] = members[server.address]["load"]
    return load


@pytest.mark.parametrize("fmt", ["TEXT", "JSON"])
def test_orca_headers_are_requested_and_counted(
    fmt: str, servers: list[VllmServer], tmp_path: Path
) -> None:
    config = f"dataLayer: {{orca: {{requestFormat: {fmt}}}}}\n"
    with epp_stack(tmp_path, flags(servers), config=config) as stack:
        body = json.dumps({"model": MODEL_NAME, "prompt": "hello", "max_tokens": 2}).encode()
        for _ in range(3):
            code, headers, answer = request(f"{stack.envoy_url}/v1/completions", body)
            assert code == 200, answer[:300]
            report = headers["endpoint-load-metrics"]
            assert report.startswith(f"{fmt} ") and "kv_cache_usage_perc" in report

        def reports(result: str) -> float:
            text = request(f"{stack.epp_http_url}/metrics")[2].decode()
            lines = [ln for ln in text.splitlines() if 'source="header"' in ln and result in ln]
            return metric_sum("\n".join(lines), "epp_orca_reports_total")

        wait_for(lambda: reports('result="ok"') == 3, what="3 ORCA reports counted")
        assert reports('result="malformed"') == 0


def tokenize(server: VllmServer, doc: dict[str, Any]) -> list[int]:
    tokens: list[int] = server.post("/tokenize", {"model": MODEL_NAME, **doc})["tokens"]
    return tokens


def test_the_engine_tokenizes_as_the_committed_fixture(servers: list[VllmServer]) -> None:
    fixture = json.loads(FIXTURE.read_text())
    live = {
        "completions": [
            {**c, "tokens": tokenize(servers[0], {"prompt": c["prompt"]})}
            for c in fixture["completions"]
        ],
        "chat": [
            {**c, "tokens": tokenize(servers[0], {"messages": c["messages"]})}
            for c in fixture["chat"]
        ],
    }
    if os.environ.get("EPP_VLLM_RECAPTURE"):  # tests/fixtures/tiny-llama/README.md
        write_fixture({**fixture, **live})
    assert live["completions"] == fixture["completions"]
    assert live["chat"] == fixture["chat"]
    assert tokenize(servers[1], {"prompt": "hello"}) == tokenize(servers[0], {"prompt": "hello"})


def write_fixture(doc: dict[str, list[dict[str, Any]]]) -> None:
    """One case a line."""
    parts = [
        f'"{kind}": [\n' + ",\n".join(json.dumps(case) for case in cases) + "\n]"
        for kind, cases in doc.items()
    ]
    FIXTURE.write_text("{\n" + ",\n".join(parts) + "\n}\n")


# Four groups of requests sharing a ~3-block (128-token blocks) prefix, two requests
# of a group back to back, every group twice: A A B B C C D D A A B B C C D D. Round
# robin sends each group to both servers (two misses per group), a prefix-aware
# router to one (one miss).
TOPICS = ("cache", "router", "decode", "memory")


def prefix_requests() -> list[dict[str, Any]]:
    docs = []
    for round_ in range(2):
        for topic in TOPICS:
            system = f"System notes about the {topic} engine. " * 3
            context = f"The {topic} report says the data is in the {topic} block. " * 30
            for q in range(2):
                question = f"Question {round_}-{q}: what is the {topic} doing?"
                docs.append(
                    {"model": MODEL_NAME, "prompt": system + context + question, "max_tokens": 2}
                )
    return docs


def run_sequence(url: str, servers: list[VllmServer]) -> float:
    """Reset both servers' prefix caches, send the sequence one request at a time, and
    return the prompt tokens vLLM served from its prefix cache (summed over servers)."""
    for s in servers:
        code, _, body = request(f"{s.url}/reset_prefix_cache", b"", method="POST")
        assert code == 200, body
    before = sum(s.metric(HITS) for s in servers)
    for doc in prefix_requests():
        code, _, body = request(f"{url}/v1/completions", json.dumps(doc).encode(), timeout=120)
        assert code == 200, body[:300]
    return sum(s.metric(HITS) for s in servers) - before


@pytest.fixture(scope="module")
def round_robin_hits(servers: list[VllmServer], tmp_path_factory: pytest.TempPathFactory) -> float:
    with round_robin_envoy(tmp_path_factory.mktemp("round-robin"), servers) as url:
        hits = run_sequence(url, servers)
    log(f"prefix-cache hits (tokens) with round robin: {hits:.0f}")
    return hits


def test_shared_prefixes_hit_vllms_cache_more_than_round_robin(
    stack: LocalStack, servers: list[VllmServer], round_robin_hits: float
) -> None:
    routed = run_sequence(stack.envoy_url, servers)
    log(f"prefix-cache hits (tokens) with the EPP's default config: {routed:.0f}")
    assert routed > round_robin_hits


@pytest.fixture(scope="module")
def precise(
    servers: list[VllmServer], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalStack]:
    """The EPP with configs/precise-prefix.yaml: the tiny model's tokenizer, and the
    servers listed as config endpoints labelled with their KV-event publishers."""
    config = yaml.safe_load((ROOT / "configs" / "precise-prefix.yaml").read_text())
    for plugin in config["plugins"]:
        if plugin["type"] == "precise-prefix-cache-scorer":
            plugin["parameters"]["tokenizer"] = str(model_dir())
    config["endpoints"] = [
        {
            "address": s.address,
            "labels": {
                EVENTS_LABEL: f"127.0.0.1:{s.kv_events_port}",
                # the history before the EPP started comes from vLLM's replay socket
                REPLAY_LABEL: f"127.0.0.1:{s.replay_port}",
            },
        }
        for s in servers
    ]
    workdir = tmp_path_factory.mktemp("epp-precise")
    with epp_stack(workdir, [], config=yaml.safe_dump(config), members=len(servers)) as s:
        wait_for(lambda: index_metric(s, "epp_kv_index_endpoints", 'state="trusted"') == 2,
                 timeout=30, what="both servers' KV events followed")  # fmt: skip
        yield s


def index_metric(stack: LocalStack, name: str, label: str) -> float:
    text = request(f"{stack.epp_http_url}/metrics")[2].decode()
    return metric_sum("\n".join(ln for ln in text.splitlines() if label in ln), name)


def epp_blocks(stack: LocalStack, server: VllmServer) -> float:
    return index_metric(stack, "epp_kv_index_blocks", f'endpoint="{server.address}"')


def test_precise_routing_hits_vllms_cache_more_than_round_robin(
    precise: LocalStack, servers: list[VllmServer], round_robin_hits: float
) -> None:
    routed = run_sequence(precise.envoy_url, servers)
    log(f"prefix-cache hits (tokens) with configs/precise-prefix.yaml: {routed:.0f}")
    assert routed > round_robin_hits
    assert index_metric(precise, "epp_kv_event_total", 'kind="gaps"') == 0


def eviction_prompts() -> list[str]:
    """~14 blocks each (~1,860 tokens), sharing their first 4: more than a server's 64
    blocks in all (BlockRemoved), and stored chains that continue a cached parent."""
    shared = "Shared start of the memory report. " + "The cache holds the block. " * 45
    return [shared + f"Tail {i}: " + f"the {i} transfer is in memory now. " * 120 for i in range(9)]


def test_the_epps_view_of_each_servers_blocks_is_what_vllm_published(
    precise: LocalStack, servers: list[VllmServer]
) -> None:
    logs = [EventLog(s.kv_events_port) for s in servers]
    try:

        def cleared() -> bool:  # our subscribers are connected once they see this
            for s in servers:
                request(f"{s.url}/reset_prefix_cache", b"", method="POST")
                # vLLM publishes AllBlocksCleared with the next engine step's batch
                s.post("/v1/completions", {"model": MODEL_NAME, "prompt": "hi", "max_tokens": 1})
            return all("AllBlocksCleared" in log_.kinds() for log_ in logs)

        wait_for(cleared, timeout=30, what="our subscribers to see AllBlocksCleared")
        for doc in prefix_requests():  # through the EPP
            code, _, body = request(f"{precise.envoy_url}/v1/completions", json.dumps(doc).encode())
            assert code == 200, body[:300]
        for prompt in eviction_prompts():  # straight to one server, past its capacity
            servers[0].post(
                "/v1/completions", {"model": MODEL_NAME, "prompt": prompt, "max_tokens": 1}
            )
        assert {"BlockStored", "BlockRemoved"} <= logs[0].kinds()
        assert any(
            e["type"] == "BlockStored" and e.get("parent_block_hash") is not None
            for e in logs[0].events()
        )
        for s, log_ in zip(servers, logs, strict=True):
            wait_for(
                lambda s=s, log_=log_: epp_blocks(precise, s) == log_.blocks(),  # type: ignore[misc]
                what=f"{s.name}'s blocks",
            )
            log(f"{s.name}: vLLM published {log_.blocks()} blocks held; the EPP's index agrees")
        assert 0 < logs[0].blocks() <= BLOCKS
        assert index_metric(precise, "epp_kv_event_total", 'kind="decode_errors"') == 0
        if os.environ.get("EPP_VLLM_RECAPTURE"):
            write_frames(logs[0].frames)
    finally:
        for log_ in logs:
            log_.close()


def write_frames(frames: list[list[bytes]]) -> None:
    """The raw messages from the first AllBlocksCleared on, as base64, one a line
    (docs/test-vllm.md)."""
    first = next(i for i, m in enumerate(frames) if b"AllBlocksCleared" in m[2])
    lines = [json.dumps([base64.b64encode(f).decode() for f in m]) for m in frames[first:]]
    FRAMES.write_text("[\n" + ",\n".join(lines) + "\n]\n")
