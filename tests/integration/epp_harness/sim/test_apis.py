"""``epp sim``'s other request APIs as a real process: Anthropic Messages (the official
``anthropic`` client, streamed and not, count_tokens, errors in Anthropic's shape),
Responses, embeddings, vLLM's and SGLang's generate, each with its usage counts."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anthropic
import orjson
import pytest

from tests.support.sim import SimProc, sims

MODEL = "sim-model"


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimProc]:
    workdir = tmp_path_factory.mktemp("sim-apis")
    args = ["--model", MODEL, "--time-scale", "0", "--enable-prompt-tokens-details"]
    with sims(Path(workdir), args) as (one,):
        yield one


def client(sim: SimProc) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=sim.url, api_key="unused", max_retries=0)


def test_messages_with_the_official_client(sim: SimProc) -> None:
    system = "You are a careful assistant. " * 8
    message = client(sim).messages.create(
        model=MODEL,
        system=system,
        max_tokens=5,
        messages=[{"role": "user", "content": [{"type": "text", "text": "Hello there"}]}],
    )
    assert message.role == "assistant" and message.stop_reason == "max_tokens"
    assert message.content[0].type == "text" and message.content[0].text
    assert message.usage.output_tokens == 5
    again = client(sim).messages.create(
        model=MODEL, system=system, max_tokens=5, messages=[{"role": "user", "content": "Hi"}]
    )
    # the shared system prompt's blocks were cached by the first request
    assert again.usage.cache_read_input_tokens
    total = again.usage.input_tokens + again.usage.cache_read_input_tokens
    counted = client(sim).messages.count_tokens(
        model=MODEL, system=system, messages=[{"role": "user", "content": "Hi"}]
    )
    assert counted.input_tokens == total


def test_streamed_messages_carry_usage_in_their_events(sim: SimProc) -> None:
    with client(sim).messages.stream(
        model=MODEL, max_tokens=6, messages=[{"role": "user", "content": "Stream me"}]
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text and final.usage.output_tokens == 6 and final.stop_reason == "max_tokens"


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
        ({"model": MODEL, "max_tokens": 3, "messages": []}, "messages"),
        (
            {"model": "other", "max_tokens": 3, "messages": [{"role": "user", "content": "x"}]},
            "does not exist",
        ),
    ],
)
def test_messages_errors_take_anthropics_shape(
    sim: SimProc, body: dict[str, object], fragment: str
) -> None:
    status, raw = sim.post("/v1/messages", body)
    doc = orjson.loads(raw)
    assert status in (400, 404) and doc["type"] == "error"
    assert fragment in doc["error"]["message"] and doc["error"]["type"]


def test_responses_and_embeddings(sim: SimProc) -> None:
    status, raw = sim.post(
        "/v1/responses",
        {"model": MODEL, "instructions": "Be brief.", "input": "Hi", "max_output_tokens": 4},
    )
    doc = orjson.loads(raw)
    assert status == 200 and doc["object"] == "response" and doc["usage"]["output_tokens"] == 4
    assert doc["output"][0]["content"][0]["text"]
    status, raw = sim.post("/v1/embeddings", {"model": MODEL, "input": ["abcd", "efgh"]})
    doc = orjson.loads(raw)
    assert status == 200 and [d["index"] for d in doc["data"]] == [0, 1]
    assert doc["usage"]["prompt_tokens"] == 2  # 8 characters, 4 a token


def test_vllm_generate_takes_and_gives_token_ids(sim: SimProc) -> None:
    body = {"token_ids": [1, 2, 3, 4, 5], "sampling_params": {"max_tokens": 3}}
    status, raw = sim.post("/inference/v1/generate", body)
    doc = orjson.loads(raw)
    assert status == 200 and len(doc["choices"][0]["token_ids"]) == 3
    assert doc["usage"]["prompt_tokens"] == 5 and doc["usage"]["completion_tokens"] == 3
    status, raw = sim.post("/inference/v1/generate", {"token_ids": [1, -2]})
    assert status == 400 and "non-negative" in orjson.loads(raw)["error"]["message"]


def test_sglang_generate_counts_in_meta_info(sim: SimProc) -> None:
    body = {"input_ids": [7, 8, 9], "sampling_params": {"max_new_tokens": 2}}
    status, raw = sim.post("/generate", body)
    doc = orjson.loads(raw)
    assert status == 200 and len(doc["output_ids"]) == 2
    meta = doc["meta_info"]
    assert (meta["prompt_tokens"], meta["completion_tokens"]) == (3, 2)
    assert meta["finish_reason"] == {"type": "length", "length": 2}
    status, raw = sim.post("/generate", {**body, "stream": True})
    events = [e for e in raw.split(b"\n\n") if e.startswith(b"data: {")]
    last = orjson.loads(events[-1][len(b"data: ") :])
    assert status == 200 and last["meta_info"]["completion_tokens"] == 2
    assert raw.rstrip().endswith(b"data: [DONE]")
