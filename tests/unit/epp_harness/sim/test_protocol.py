"""Request parsing and response builders of the simulator (plain data)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from epp_harness.sim import responses
from epp_harness.sim.protocol import (
    MAX_TOKENS_LIMIT,
    ApiKind,
    GenerationRequest,
    SimError,
    parse_request,
    text_tokens,
)

MODEL = "sim-model"


def parse(kind: ApiKind, body: Any, request_id: str | None = None) -> GenerationRequest:
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    return parse_request(
        kind, raw, served_model=MODEL, default_max_tokens=16, request_id=request_id
    )


def completion(**fields: Any) -> GenerationRequest:
    return parse(ApiKind.COMPLETION, {"model": MODEL, **fields})


def chat(messages: Any, **fields: Any) -> GenerationRequest:
    return parse(ApiKind.CHAT, {"model": MODEL, "messages": messages, **fields})


@pytest.mark.parametrize(("chars", "tokens"), [(0, 0), (1, 1), (4, 1), (5, 2), (400, 100)])
def test_text_tokens_is_ceil_of_chars_over_four(chars: int, tokens: int) -> None:
    assert text_tokens("x" * chars) == tokens


def test_completion_prompt_forms() -> None:
    assert completion(prompt="x" * 9).prompt_tokens == 3
    joined = completion(prompt=["ab", "cdefg"])
    assert (joined.prompt_text, joined.prompt_tokens) == ("abcdefg", 2)
    ids = completion(prompt=[5, 6, 7])
    assert (ids.prompt_token_ids, ids.prompt_tokens) == ((5, 6, 7), 3)
    nested = completion(prompt=[[1, 2], [3]])
    assert (nested.prompt_token_ids, nested.prompt_tokens) == ((1, 2, 3), 3)


def test_chat_prompt_concatenates_message_contents() -> None:
    req = chat(
        [
            {"role": "system", "content": "abcd"},
            {"role": "user", "content": [{"type": "text", "text": "efgh"}, {"type": "image_url"}]},
            {"role": "assistant", "content": None},
            {"role": "user", "content": "ij"},
        ]
    )
    assert (req.prompt_text, req.prompt_tokens, req.prompt_token_ids) == ("abcdefghij", 3, None)


def test_limits_and_stream_flags() -> None:
    assert completion(prompt="p").max_tokens == 16
    assert completion(prompt="p", max_tokens=3).max_tokens == 3
    assert (
        chat([{"role": "user", "content": "p"}], max_completion_tokens=4, max_tokens=9).max_tokens
        == 4
    )
    req = completion(prompt="p", stream=True, stream_options={"include_usage": True})
    assert req.stream and req.include_usage
    assert not completion(prompt="p", stream=True).include_usage
    assert not completion(prompt="p", stream=None).stream


def test_request_id_comes_from_the_header_or_is_random() -> None:
    assert parse(ApiKind.COMPLETION, {"model": MODEL, "prompt": "p"}, "abc").request_id == "abc"
    a, b = completion(prompt="p").request_id, completion(prompt="p").request_id
    assert a != b and len(a) == 32


@pytest.mark.parametrize(
    ("kind", "body", "status", "needle"),
    [
        (ApiKind.COMPLETION, b"{not json", 400, "Invalid JSON"),
        (ApiKind.COMPLETION, b"[1, 2]", 400, "JSON object"),
        (ApiKind.COMPLETION, {"prompt": "p"}, 400, "`model`"),
        (ApiKind.COMPLETION, {"model": 7, "prompt": "p"}, 400, "`model`"),
        (ApiKind.COMPLETION, {"model": "other", "prompt": "p"}, 404, "The model `other` does"),
        (ApiKind.COMPLETION, {"model": MODEL}, 400, "`prompt`"),
        (ApiKind.COMPLETION, {"model": MODEL, "prompt": ""}, 400, "`prompt`"),
        (ApiKind.COMPLETION, {"model": MODEL, "prompt": []}, 400, "`prompt`"),
        (ApiKind.COMPLETION, {"model": MODEL, "prompt": ["a", 1]}, 400, "`prompt`"),
        (ApiKind.COMPLETION, {"model": MODEL, "prompt": {"a": 1}}, 400, "`prompt`"),
        (ApiKind.CHAT, {"model": MODEL}, 400, "`messages`"),
        (ApiKind.CHAT, {"model": MODEL, "messages": []}, 400, "`messages`"),
        (ApiKind.CHAT, {"model": MODEL, "messages": ["hi"]}, 400, "`messages[0]`"),
        (ApiKind.CHAT, {"model": MODEL, "messages": [{"role": "u", "content": 3}]}, 400, "content"),
        (ApiKind.COMPLETION, {"model": MODEL, "prompt": "p", "max_tokens": 0}, 400, "max_tokens"),
        (ApiKind.COMPLETION, {"model": MODEL, "prompt": "p", "max_tokens": -1}, 400, "max_tokens"),
        (ApiKind.COMPLETION, {"model": MODEL, "prompt": "p", "max_tokens": "5"}, 400, "max_tokens"),
        (ApiKind.COMPLETION, {"model": MODEL, "prompt": "p", "max_tokens": True}, 400, "max_tok"),
        (ApiKind.COMPLETION, {"model": MODEL, "prompt": "p", "max_tokens": 1.5}, 400, "max_tok"),
        (
            ApiKind.COMPLETION,
            {"model": MODEL, "prompt": "p", "max_tokens": MAX_TOKENS_LIMIT + 1},
            400,
            "max_tokens",
        ),
        (ApiKind.CHAT, {"model": MODEL, "messages": [], "max_completion_tokens": 0}, 400, "mess"),
        (ApiKind.COMPLETION, {"model": MODEL, "prompt": "p", "stream": "yes"}, 400, "`stream`"),
        (
            ApiKind.COMPLETION,
            {"model": MODEL, "prompt": "p", "stream_options": {"include_usage": True}},
            400,
            "stream=True",
        ),
    ],
)
def test_invalid_requests(kind: ApiKind, body: Any, status: int, needle: str) -> None:
    with pytest.raises(SimError) as info:
        parse(kind, body)
    assert info.value.status == status
    assert needle in info.value.message


def test_error_body_has_the_vllm_shape() -> None:
    assert SimError(404, "gone").body() == {
        "error": {"message": "gone", "type": "NotFoundError", "param": None, "code": 404}
    }
    assert SimError(400, "bad").body()["error"]["type"] == "BadRequestError"


def test_generated_text_is_four_chars_per_token_and_matches_the_chunks() -> None:
    for n in (0, 1, 7, 8, 9, 100):
        text = responses.generated_text(n)
        assert len(text) == 4 * n
        assert text == "".join(responses.token_text(i) for i in range(n))


def test_return_token_ids_gives_the_output_ids_and_the_prompts() -> None:
    ask = {"model": MODEL, "prompt": [5, 6, 7], "return_token_ids": True}
    body = responses.full_response(parse(ApiKind.COMPLETION, ask, "rid"), "cmpl-rid", 1, 3)
    choice = body["choices"][0]
    assert choice["token_ids"] == [responses.token_id(i) for i in range(3)]
    assert choice["prompt_token_ids"] == [5, 6, 7]
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    body = responses.full_response(
        parse(ApiKind.CHAT, {**chat, "return_token_ids": True}, "rid"), "chatcmpl-rid", 1, 2
    )
    assert body["choices"][0]["token_ids"] == [responses.token_id(0), responses.token_id(1)]
    assert body["prompt_token_ids"] is None  # a text prompt the simulator did not tokenize
    plain = responses.full_response(parse(ApiKind.CHAT, chat, "rid"), "chatcmpl-rid", 1, 2)
    assert "token_ids" not in plain["choices"][0] and "prompt_token_ids" not in plain


def test_completion_response_shapes() -> None:
    req = parse(ApiKind.COMPLETION, {"model": MODEL, "prompt": "x" * 8}, "rid")
    body = responses.full_response(req, responses.response_id(req), 123, 3)
    assert body["id"] == "cmpl-rid" and body["object"] == "text_completion"
    assert (body["created"], body["model"]) == (123, MODEL)
    assert body["choices"] == [
        {
            "index": 0,
            "text": responses.generated_text(3),
            "logprobs": None,
            "finish_reason": "length",
            "stop_reason": None,
        }
    ]
    assert body["usage"]["prompt_tokens"] == 2
    assert body["usage"]["completion_tokens"] == 3
    assert body["usage"]["total_tokens"] == 5
    chunk = responses.token_chunk(req, "cmpl-rid", 123, 0, last=False)
    assert chunk["object"] == "text_completion"
    assert chunk["choices"][0]["text"] == responses.token_text(0)
    assert chunk["choices"][0]["finish_reason"] is None
    assert responses.token_chunk(req, "r", 1, 2, last=True)["choices"][0]["finish_reason"] == (
        "length"
    )


def test_chat_response_shapes() -> None:
    req = chat([{"role": "user", "content": "hello"}])
    rid = responses.response_id(req)
    assert rid.startswith("chatcmpl-")
    body = responses.full_response(req, rid, 1, 2)
    assert body["object"] == "chat.completion"
    message = body["choices"][0]["message"]
    assert message["role"] == "assistant" and message["content"] == responses.generated_text(2)
    role = responses.role_chunk(req, rid, 1)
    assert role["object"] == "chat.completion.chunk"
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    chunk = responses.token_chunk(req, rid, 1, 1, last=True)
    assert chunk["choices"][0]["delta"] == {"content": responses.token_text(1)}
    assert chunk["choices"][0]["finish_reason"] == "length"
    usage = responses.usage_chunk(req, rid, 1, 2)
    assert usage["choices"] == [] and usage["usage"]["total_tokens"] == 2 + req.prompt_tokens


def test_prompt_tokens_details_as_vllm_shapes_them() -> None:
    req = chat([{"role": "user", "content": "x" * 400}])
    # Off (vLLM's default) or nothing cached: null; otherwise the cached count.
    assert responses.usage(100, 2)["prompt_tokens_details"] is None
    assert responses.usage(100, 2, 0)["prompt_tokens_details"] == {"cached_tokens": 0}
    assert responses.usage(100, 2, 96)["prompt_tokens_details"] == {"cached_tokens": 96}
    body = responses.full_response(req, "r", 1, 2, cached_tokens=96)
    assert body["usage"]["prompt_tokens_details"] == {"cached_tokens": 96}
    chunk = responses.usage_chunk(req, "r", 1, 2, cached_tokens=96)
    assert chunk["usage"]["prompt_tokens_details"] == {"cached_tokens": 96}


def test_sse_framing() -> None:
    assert responses.sse({"a": 1}) == b'data: {"a":1}\n\n'
    assert responses.SSE_DONE == b"data: [DONE]\n\n"


def test_models_list() -> None:
    body = responses.models_list(MODEL, 5, 100)
    assert body["object"] == "list"
    assert [m["id"] for m in body["data"]] == [MODEL]
    assert body["data"][0]["object"] == "model"
