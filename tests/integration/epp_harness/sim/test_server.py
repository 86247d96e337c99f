"""``epp sim`` as a real process: the OpenAI API (official client and raw wire format),
errors, /metrics and the /sim/* test hooks. One instance at time scale 0 serves all."""

from __future__ import annotations

import hashlib
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from epp_harness.procs import ManagedProcess, start_epp

MODEL = "sim-test-model"


def start_sim(workdir: Path, name: str, *args: str) -> ManagedProcess:
    return start_epp(workdir, name, "sim", "--port", "0", *args)


@dataclass
class Sim:
    proc: ManagedProcess
    url: str
    instance: str


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sim]:
    workdir = tmp_path_factory.mktemp("sim-api")
    proc = start_sim(workdir, "sim", "--model", MODEL, "--time-scale", "0")
    yield Sim(proc, proc.info["url"], proc.info["instance"])
    assert proc.stop() == 0
    assert "Traceback" not in proc.log_tail(500)


@pytest.fixture
def client(sim: Sim) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{sim.url}/v1", api_key="unused", max_retries=0)


def http(
    url: str, data: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    """(status, lower-cased headers, body) of one request; HTTP errors are answers too."""
    req = urllib.request.Request(url, data=data, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, {k.lower(): v for k, v in err.headers.items()}, err.read()


def get_json(url: str) -> Any:
    status, _, body = http(url)
    assert status == 200, body
    return json.loads(body)


def scrape(url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    status, headers, body = http(f"{url}/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain")
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            samples.setdefault(s.name, []).append((s.labels, s.value))
    return samples


def test_ready_file_describes_the_bound_port(sim: Sim) -> None:
    info = sim.proc.info
    assert info["port"] > 0 and info["host"] == "127.0.0.1"
    assert info["url"] == f"http://127.0.0.1:{info['port']}"
    assert info["instance"] == f"127.0.0.1:{info['port']}"


def test_openai_completion(client: openai.OpenAI) -> None:
    out = client.completions.create(model=MODEL, prompt="x" * 40, max_tokens=5)
    assert out.id.startswith("cmpl-") and out.object == "text_completion"
    assert out.model == MODEL
    assert len(out.choices[0].text) == 20 and out.choices[0].finish_reason == "length"
    assert out.usage is not None
    assert (out.usage.prompt_tokens, out.usage.completion_tokens, out.usage.total_tokens) == (
        10,
        5,
        15,
    )


def test_openai_completion_stream_with_usage(client: openai.OpenAI) -> None:
    chunks = list(
        client.completions.create(
            model=MODEL,
            prompt="hello",
            max_tokens=7,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text_chunks, usage_chunk = chunks[:-1], chunks[-1]
    assert len(text_chunks) == 7
    assert len({c.id for c in chunks}) == 1
    assert len("".join(c.choices[0].text for c in text_chunks)) == 28
    assert [c.choices[0].finish_reason for c in text_chunks] == [None] * 6 + ["length"]
    assert usage_chunk.choices == [] and usage_chunk.usage is not None
    assert (usage_chunk.usage.prompt_tokens, usage_chunk.usage.completion_tokens) == (2, 7)


def test_openai_chat(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        max_completion_tokens=3,
    )
    assert out.id.startswith("chatcmpl-") and out.object == "chat.completion"
    message = out.choices[0].message
    assert message.role == "assistant" and message.content is not None
    assert len(message.content) == 12
    assert out.choices[0].finish_reason == "length"
    assert out.usage is not None and out.usage.prompt_tokens == 3


def test_openai_chat_stream_with_usage(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(content) == 16
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 4


def test_openai_chat_stream_without_usage_has_no_usage_chunk(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2, stream=True
        )
    )
    assert all(c.choices for c in chunks) and chunks[-1].choices[0].finish_reason == "length"


async def test_sse_wire_format(sim: Sim) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    body |= {"stream": True, "stream_options": {"include_usage": True}}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{sim.url}/v1/chat/completions", json=body) as resp,
    ):
        assert resp.status == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        assert resp.headers["x-sim-instance"] == sim.instance
        raw = await resp.read()
    assert raw.endswith(b"\n\ndata: [DONE]\n\n")
    events = raw.split(b"\n\n")
    assert events[-1] == b"" and events[-2] == b"data: [DONE]"
    payloads = [json.loads(e.removeprefix(b"data: ")) for e in events[:-2]]
    assert all(e.startswith(b"data: {") for e in events[:-2])
    assert [len(p["choices"]) for p in payloads] == [1, 1, 1, 0]  # role, 2 tokens, usage
    assert payloads[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert payloads[2]["choices"][0]["finish_reason"] == "length"
    assert payloads[2]["choices"][0]["stop_reason"] is None
    assert payloads[2]["choices"][0]["logprobs"] is None
    assert isinstance(payloads[0]["created"], int)


def test_request_id_header_becomes_the_response_id(sim: Sim) -> None:
    body = json.dumps({"model": MODEL, "prompt": "p", "max_tokens": 1}).encode()
    status, _, raw = http(f"{sim.url}/v1/completions", body, {"x-request-id": "req-42"})
    assert status == 200 and json.loads(raw)["id"] == "cmpl-req-42"


GOOD = {"model": MODEL, "prompt": "p"}


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        ("/v1/completions", b"{oops", 400),
        ("/v1/completions", b"", 400),
        ("/v1/completions", b'"a string"', 400),
        ("/v1/completions", json.dumps({"prompt": "p"}).encode(), 400),
        ("/v1/completions", json.dumps({"model": ["m"], "prompt": "p"}).encode(), 400),
        ("/v1/completions", json.dumps({"model": MODEL}).encode(), 400),
        ("/v1/chat/completions", json.dumps({"model": MODEL}).encode(), 400),
        ("/v1/completions", json.dumps(GOOD | {"max_tokens": 0}).encode(), 400),
        ("/v1/completions", json.dumps(GOOD | {"max_tokens": "9"}).encode(), 400),
        ("/v1/completions", json.dumps(GOOD | {"model": "nope"}).encode(), 404),
        ("/v1/chat/completions", json.dumps({"model": "nope", "messages": []}).encode(), 404),
    ],
)
def test_errors_are_openai_shaped(sim: Sim, path: str, body: bytes, status: int) -> None:
    got, headers, raw = http(f"{sim.url}{path}", body, {"content-type": "application/json"})
    assert got == status
    assert headers["content-type"].startswith("application/json")
    assert headers["x-sim-instance"] == sim.instance
    error = json.loads(raw)["error"]
    assert isinstance(error["message"], str) and error["message"]
    assert error["code"] == status
    assert error["type"] == {400: "BadRequestError", 404: "NotFoundError"}[status]
    if status == 404:
        assert error["message"] == "The model `nope` does not exist."
    # The server keeps serving.
    assert http(f"{sim.url}/health")[0] == 200


def test_models_and_health(sim: Sim) -> None:
    models = get_json(f"{sim.url}/v1/models")
    assert models["object"] == "list" and [m["id"] for m in models["data"]] == [MODEL]
    status, headers, body = http(f"{sim.url}/health")
    assert (status, body, headers["x-sim-instance"]) == (200, b"", sim.instance)


def test_metrics_have_vllm_names_labels_and_move(sim: Sim, client: openai.OpenAI) -> None:
    before = scrape(sim.url)
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:cache_config_info",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:request_success_total",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:time_to_first_token_seconds_count",
        "vllm:time_to_first_token_seconds_bucket",
    ):
        assert name in before, name
        assert all(labels["model_name"] == MODEL for labels, _ in before[name]), name
    [(info_labels, info_value)] = before["vllm:cache_config_info"]
    assert (info_labels["block_size"], info_labels["num_gpu_blocks"], info_value) == (
        "16",
        "8192",
        1.0,
    )
    assert 0 <= before["vllm:kv_cache_usage_perc"][0][1] <= 1

    prompt = "m" * 256  # 64 tokens = 4 full blocks
    for _ in range(2):
        client.completions.create(model=MODEL, prompt=prompt, max_tokens=3)
    after = scrape(sim.url)

    def delta(name: str) -> float:
        return after[name][0][1] - before[name][0][1]

    assert delta("vllm:prompt_tokens_total") == 128
    assert delta("vllm:generation_tokens_total") == 6
    assert delta("vllm:request_success_total") == 2
    assert delta("vllm:prefix_cache_queries_total") == 128
    # the second one hits all but its last block: vLLM computes a prompt's last token
    assert delta("vllm:prefix_cache_hits_total") == 48
    assert delta("vllm:time_to_first_token_seconds_count") == 2
    assert after["vllm:num_requests_running"][0][1] == 0


def test_sim_stats(sim: Sim, client: openai.OpenAI) -> None:
    before = get_json(f"{sim.url}/sim/stats")
    client.completions.create(model=MODEL, prompt="s" * 80, max_tokens=2)
    after = get_json(f"{sim.url}/sim/stats")
    assert after["instance"] == sim.instance and after["model"] == MODEL
    assert after["requests_total"] == before["requests_total"] + 1
    assert after["prompt_tokens_total"] == before["prompt_tokens_total"] + 20
    assert after["generation_tokens_total"] == before["generation_tokens_total"] + 2
    assert after["prefix_cache_queries_tokens"] == before["prefix_cache_queries_tokens"] + 20
    assert (after["running"], after["waiting"], after["kv_blocks_used"]) == (0, 0, 0)
    assert after["kv_blocks_total"] == 8192
    assert after["prefix_cache_hits_tokens"] >= before["prefix_cache_hits_tokens"]


@pytest.mark.parametrize("prompt_chars", [10, 1024 * 1024])
def test_last_request_records_the_exact_bytes(sim: Sim, prompt_chars: int) -> None:
    # Odd spacing and key order: the digest must be of the bytes sent, not a re-encoding.
    body = b'{ "max_tokens" : 1,\n "prompt": "' + b"z" * prompt_chars + b'", "model": "'
    body += MODEL.encode() + b'" }'
    status, _, raw = http(
        f"{sim.url}/v1/completions", body, {"Content-Type": "application/json", "X-Trace": "t1"}
    )
    assert status == 200, raw
    last = get_json(f"{sim.url}/sim/last-request")
    assert last["path"] == "/v1/completions"
    assert last["body_bytes"] == len(body)
    assert last["body_sha256"] == hashlib.sha256(body).hexdigest()
    assert last["headers"]["x-trace"] == "t1"
    assert last["headers"]["content-type"] == "application/json"
    assert last["body"] == {"max_tokens": 1, "prompt": "z" * prompt_chars, "model": MODEL}


def test_last_request_body_is_null_when_not_json(sim: Sim) -> None:
    status, _, _ = http(f"{sim.url}/v1/completions", b"{not json", {"X-Trace": "t2"})
    assert status == 400
    last = get_json(f"{sim.url}/sim/last-request")
    assert last["body"] is None and last["body_bytes"] == 9 and last["headers"]["x-trace"] == "t2"


def test_every_response_names_its_instance(sim: Sim) -> None:
    for path in ("/metrics", "/sim/stats", "/v1/models", "/no-such-route"):
        _, headers, _ = http(f"{sim.url}{path}")
        assert headers["x-sim-instance"] == sim.instance, path


@pytest.mark.parametrize("body", [b"{", b"{}", b'{"metrics_down": "yes"}'])
def test_faults_rejects_bad_input(sim: Sim, body: bytes) -> None:
    status, _, raw = http(f"{sim.url}/sim/faults", body)
    assert status == 400
    assert "metrics_down" in json.loads(raw)["error"]["message"]


def test_faults_toggle_metrics(sim: Sim) -> None:
    assert http(f"{sim.url}/sim/faults", b'{"metrics_down": true}')[0] == 200
    try:
        assert http(f"{sim.url}/metrics")[0] == 503
        assert http(f"{sim.url}/v1/models")[0] == 200  # requests are still served
    finally:
        assert http(f"{sim.url}/sim/faults", b'{"metrics_down": false}')[0] == 200
    assert http(f"{sim.url}/metrics")[0] == 200
