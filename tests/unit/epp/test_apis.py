"""The request APIs by path (epp.common.apis): what each reads from a body, what it
refuses (in its own error shape), and the usage it finds in a response."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from epp.common.apis import API_BY_PATH, DEFAULT, api_for
from epp.common.apis.anthropic import COUNT_TOKENS, MESSAGES, chat_body
from epp.common.requestparse import parse_request
from epp.common.usage import TAIL_BYTES, Tail, Usage
from epp.errors import (
    BadRequestError,
    BodyTooLargeError,
    NoEndpointError,
    PrefillRejectedError,
    ShedError,
)
from epp.types import InferenceRequest

SYSTEM = "You are a coding agent. Follow the rules. " * 4


def parse(path: str, doc: Any) -> InferenceRequest:
    body = doc if isinstance(doc, bytes) else orjson.dumps(doc)
    return parse_request("r", {":path": path}, body)[0]


def messages(**fields: Any) -> dict[str, Any]:
    return {
        "model": "m",
        "max_tokens": 16,
        "messages": [{"role": "user", "content": "Fix the bug"}],
        **fields,
    }


def test_each_path_has_its_api_and_the_rest_are_read_as_openai() -> None:
    assert api_for("/v1/messages?beta=true") is API_BY_PATH[MESSAGES]
    assert api_for("/v1/completions") is DEFAULT and api_for("/v1/chat/completions") is DEFAULT
    assert api_for("/some/other/path") is DEFAULT
    names = {path: api.name for path, api in API_BY_PATH.items()}
    assert names[MESSAGES] == names[COUNT_TOKENS] == "anthropic-parser"
    assert names["/inference/v1/generate"] == "vllmhttp-parser"
    assert names["/generate"] == "sglanghttp-parser"


def test_messages_prompt_puts_system_and_tools_before_the_turns() -> None:
    tools = [{"name": "edit", "description": "Edit a file", "input_schema": {"type": "object"}}]
    turns = [
        {"role": "user", "content": [{"type": "text", "text": "Fix it"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "look first"},
                {"type": "tool_use", "id": "t1", "name": "edit", "input": {"path": "a.py"}},
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "done"}],
        },
    ]
    system = [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=1; cch=ab12;"},
        {"type": "text", "text": SYSTEM},
    ]
    req = parse(MESSAGES, messages(system=system, tools=tools, messages=turns, stream=True))
    assert req.prompt == (
        f"system: {SYSTEM}\n"
        'tool: edit Edit a file {"type":"object"}\n'
        "user: Fix it\n"
        'assistant: look firstedit {"path":"a.py"}\n'
        "user: done\n"
    )
    assert (req.model, req.stream, req.max_tokens) == ("m", True, 16)
    assert req.prompt_token_count is None  # estimated from the text


def test_a_billing_header_does_not_change_the_prefix() -> None:
    one = parse(
        MESSAGES, messages(system=[{"type": "text", "text": "x-anthropic-billing-header: a"}])
    )
    two = parse(
        MESSAGES, messages(system=[{"type": "text", "text": "x-anthropic-billing-header: b"}])
    )
    assert one.prompt == two.prompt


def test_count_tokens_is_checked_but_routes_by_no_prompt() -> None:
    req = parse(COUNT_TOKENS, {"model": "m", "messages": [{"role": "user", "content": "x"}]})
    assert (req.model, req.prompt, req.max_tokens, req.stream) == ("m", "", None, False)
    with pytest.raises(BadRequestError):
        parse(COUNT_TOKENS, {"model": "m", "messages": "x"})


@pytest.mark.parametrize(
    ("doc", "fragment"),
    [
        (messages(max_tokens=None), "'max_tokens'"),
        (messages(max_tokens="16"), "'max_tokens'"),
        (messages(max_tokens=0), "'max_tokens'"),
        (messages(stream="yes"), "'stream'"),
        (messages(messages=[]), "'messages'"),
        (messages(messages={"role": "user"}), "'messages'"),
        (messages(messages=[{"role": "robot", "content": "x"}]), "'messages[0]'"),
        (messages(messages=[{"role": "user", "content": 3}]), "'messages[0].content'"),
        (messages(messages=[{"role": "user", "content": ["x"]}]), "'messages[0].content[0]'"),
        (messages(system=3), "'system'"),
        (messages(system=[{"text": "no type"}]), "'system[0]'"),
        (messages(tools={"name": "x"}), "'tools'"),
        (messages(tools=[{"description": "no name"}]), "'tools[0]'"),
        ({"max_tokens": 3, "messages": [{"role": "user", "content": "x"}]}, "'model'"),
    ],
)
def test_bad_messages_say_what_is_wrong(doc: dict[str, Any], fragment: str) -> None:
    with pytest.raises(BadRequestError) as info:
        parse(MESSAGES, doc)
    assert info.value.status == 400 and fragment in info.value.message


def test_errors_on_messages_take_anthropics_shape() -> None:
    api = API_BY_PATH[MESSAGES]
    for error, kind in [
        (BadRequestError("bad", code="invalid_json"), "invalid_request_error"),
        (BodyTooLargeError("big"), "request_too_large"),
        (ShedError("busy"), "rate_limit_error"),
        (NoEndpointError("none"), "overloaded_error"),
    ]:
        body = orjson.loads(api.error_body(error))
        assert body == {"type": "error", "error": {"type": kind, "message": error.message}}
    upstream = b'{"type":"error","error":{"type":"invalid_request_error","message":"no"}}'
    assert api.error_body(PrefillRejectedError(400, upstream, "prefill said no")) == upstream
    # the other APIs answer OpenAI's shape
    error = BadRequestError("bad", code="invalid_json")
    assert "type" not in orjson.loads(API_BY_PATH["/generate"].error_body(error))


@pytest.mark.parametrize("path", [MESSAGES, "/inference/v1/generate", "/generate", "/v1/responses"])
def test_malformed_json_is_refused_before_any_api_reads_it(path: str) -> None:
    deep = b'{"model": "m", "x": ' + b"[" * 2000 + b"]" * 2000 + b"}"
    for body, code in [
        (b'{"model": "m\xff"}', "invalid_json"),  # invalid UTF-8
        (deep, "invalid_json"),  # nested past the decoder's depth limit
        (b"[1]", "invalid_body"),
        (b"", "empty_body"),
    ]:
        with pytest.raises(BadRequestError) as info:
            parse(path, body)
        assert info.value.code == code


def test_tool_input_nested_past_the_encoder_still_parses() -> None:
    # orjson decodes 1024 levels, encodes 255: the body is written by hand
    deep = b'{"a": ' * 400 + b"{}" + b"}" * 400
    call = b'{"type": "tool_use", "id": "t", "name": "deep", "input": ' + deep + b"}"
    body = b'{"model": "m", "max_tokens": 4, "messages": [{"role": "assistant", "content": ['
    req = parse(MESSAGES, body + call + b"]}]}")
    assert req.prompt == "assistant: deep \n"


def test_vllm_generate_counts_its_token_ids() -> None:
    doc = {"token_ids": [1, 2, 70000], "sampling_params": {"max_tokens": 9}, "stream": True}
    req = parse("/inference/v1/generate", doc)
    assert (req.prompt, req.prompt_token_count, req.prompt_tokens) == ("000100020000", 3, 3)
    assert (req.model, req.max_tokens, req.stream) == ("", 9, True)  # the served model
    assert parse("/inference/v1/generate", {**doc, "model": "m"}).model == "m"


@pytest.mark.parametrize(
    "ids",
    [None, [], "1 2", [1, -1], [1, True], [1, 2.0], [1, "2"], [1, None], [2**32], [[1, 2]]],
)
def test_token_ids_that_are_not_non_negative_integers_are_400(ids: Any) -> None:
    with pytest.raises(BadRequestError) as info:
        parse("/inference/v1/generate", {"token_ids": ids})
    assert info.value.code == "invalid_token_ids" and "'token_ids'" in info.value.message


def test_sglang_generate_reads_ids_batches_or_text() -> None:
    req = parse("/generate", {"input_ids": [[5, 6], [7]], "sampling_params": {"max_new_tokens": 4}})
    assert (req.prompt, req.prompt_token_count, req.max_tokens) == ("000500060007", 3, 4)
    text = parse("/generate", {"text": "hello world"})
    assert (text.prompt, text.prompt_token_count) == ("hello world", None)
    for doc in [{}, {"text": ""}, {"text": 5}, {"input_ids": [[1], [-1]]}, {"sampling_params": 1}]:
        with pytest.raises(BadRequestError):
            parse("/generate", doc)


def test_responses_and_embeddings_read_their_input() -> None:
    doc = {
        "model": "m",
        "instructions": "Be brief.",
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "Hi"}]}],
        "max_output_tokens": 7,
    }
    req = parse("/v1/responses", doc)
    assert (req.prompt, req.max_tokens) == ("system: Be brief.\nuser: Hi\n", 7)
    assert parse("/v1/responses", {"model": "m", "input": "Hi"}).prompt == "user: Hi\n"
    assert parse("/v1/embeddings", {"model": "m", "input": ["ab", "cd"]}).prompt == "abcd"
    ids = parse("/v1/embeddings", {"model": "m", "input": [3, 4]})
    assert ids.prompt_token_count == 2
    with pytest.raises(BadRequestError):
        parse("/v1/embeddings", {"input": "no model"})


def sse(*events: tuple[str, dict[str, Any]]) -> bytes:
    return b"".join(
        f"event: {name}\ndata: ".encode() + orjson.dumps(data) + b"\n\n" for name, data in events
    )


def test_anthropic_usage_counts_cached_input_and_reads_message_start() -> None:
    usage = API_BY_PATH[MESSAGES].usage
    body = orjson.dumps(
        {
            "type": "message",
            "usage": {"input_tokens": 5, "output_tokens": 3, "cache_read_input_tokens": 64},
        }
    )
    assert usage(b"", body) == Usage(69, 3, 64)
    start = (
        "message_start",
        {"type": "message_start", "message": {"usage": {"input_tokens": 40, "output_tokens": 0}}},
    )
    end = ("message_delta", {"type": "message_delta", "usage": {"output_tokens": 12}})
    stream = sse(start, *[("content_block_delta", {"text": "x" * 100})] * 60, end)
    kept = Tail()
    for i in range(0, len(stream), 333):  # the head is gone from the tail by the end
        kept.add(stream[i : i + 333])
    tail = kept.bytes()
    assert b"message_start" not in tail
    assert usage(stream[:TAIL_BYTES], tail) == Usage(40, 12)
    assert usage(b"", tail) is None  # no input count anywhere
    assert usage(b"", b'{"usage": {"output_tokens": "x"}}') is None
    bad_input = b'{"usage": {"input_tokens": -1, "output_tokens": 1}}'
    assert usage(b"", bad_input) is None


def test_other_usage_shapes() -> None:
    meta = b'"meta_info":{"prompt_tokens":9,"completion_tokens":2,"cached_tokens":4}'
    sglang = b'data: {"text":"ab",' + meta + b"}\n\ndata: [DONE]\n\n"
    assert API_BY_PATH["/generate"].usage(b"", sglang) == Usage(9, 2, 4)
    responses = (
        b'{"usage":{"input_tokens":8,"input_tokens_details":{"cached_tokens":8},"output_tokens":1}}'
    )
    assert API_BY_PATH["/v1/responses"].usage(b"", responses) == Usage(8, 1, 8)
    embeddings = b'{"data":[],"usage":{"prompt_tokens":6,"total_tokens":6}}'
    assert API_BY_PATH["/v1/embeddings"].usage(b"", embeddings) == Usage(6, 0)
    openai = b'{"usage":{"prompt_tokens":3,"completion_tokens":1}}'
    assert API_BY_PATH["/inference/v1/generate"].usage(b"", openai) == Usage(3, 1)


def test_chat_body_is_the_chat_request_vllm_makes() -> None:
    doc = messages(
        system=SYSTEM,
        tools=[{"name": "edit", "input_schema": {"type": "object"}}],
        messages=[
            {"role": "user", "content": "Fix it"},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t1", "name": "edit", "input": {"p": 1}}],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": "ok"},
                    {"type": "text", "text": "next"},
                ],
            },
        ],
    )
    body = chat_body(doc)
    assert body is not None
    assert body["messages"] == [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Fix it"},
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": "t1",
                    "type": "function",
                    "function": {"name": "edit", "arguments": '{"p": 1}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "t1", "content": "ok"},
        {"role": "user", "content": "next"},
    ]
    assert body["tools"][0]["function"]["parameters"] == {"type": "object"}
    image = {"type": "image", "source": {"type": "base64", "data": "AA"}}
    assert chat_body(messages(messages=[{"role": "user", "content": [image]}])) is None
