"""Build vLLM's OpenAI-compatible response bodies and SSE chunks (pure, no I/O), and
the aiohttp JSON responses that carry them.

Shapes follow vLLM's ``/v1/completions`` and ``/v1/chat/completions``: ids ``cmpl-*`` /
``chatcmpl-*``, ``logprobs: null``, ``finish_reason`` plus ``stop_reason: null``, and
``usage`` on non-streaming bodies or, with ``stream_options.include_usage``, as a last
chunk whose ``choices`` is empty. Generated text is a cycle of 4-character words, so a
text's length is exactly 4 characters per token.
"""

from __future__ import annotations

import time
from typing import Any

import orjson
from aiohttp import web

from epp_harness.sim.protocol import ApiKind, GenerationRequest, SimError

# Each word is exactly 4 characters: the simulator's tokenizer rule (chars / 4).
WORDS = ("the ", "sim ", "tok ", "and ", "kv. ", "gpu ", "for ", "one ")
_CYCLE = "".join(WORDS)
SSE_DONE = b"data: [DONE]\n\n"
# Every simulated sequence stops because it reached its token limit.
FINISH_LENGTH = "length"


def token_text(index: int) -> str:
    """The text of the ``index``-th generated token."""
    return WORDS[index % len(WORDS)]


def token_id(index: int) -> int:
    """The token id reported for the ``index``-th generated token (``return_token_ids``,
    and what a token-id prompt's blocks cache): its word's first byte, as the
    simulator's byte tokenizer numbers it."""
    return WORDS[index % len(WORDS)].encode()[0]


def generated_text(count: int) -> str:
    """The concatenated text of the first ``count`` generated tokens."""
    whole, rest = divmod(count, len(WORDS))
    return _CYCLE * whole + _CYCLE[: rest * len(WORDS[0])]


def response_id(req: GenerationRequest) -> str:
    prefix = "chatcmpl-" if req.kind is ApiKind.CHAT else "cmpl-"
    return prefix + req.request_id


def now_created() -> int:
    return int(time.time())


def usage(
    prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None
) -> dict[str, Any]:
    """vLLM's ``usage`` object. ``cached_tokens`` is None unless the server reports prompt
    token details (``--enable-prompt-tokens-details``); vLLM 0.32 then fills
    ``prompt_tokens_details`` for every request, 0 included (its serving code tests the
    engine's ``num_cached_tokens`` against None, which it never is; older versions left
    0 null)."""
    details = None if cached_tokens is None else {"cached_tokens": cached_tokens}
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": details,
    }


def full_response(
    req: GenerationRequest,
    rid: str,
    created: int,
    completion_tokens: int,
    cached_tokens: int | None = None,
) -> dict[str, Any]:
    """The non-streaming body for ``completion_tokens`` generated tokens (``cached_tokens``
    as in :func:`usage`)."""
    text = generated_text(completion_tokens)
    choice: dict[str, Any] = {"index": 0}
    if req.kind is ApiKind.CHAT:
        choice["message"] = {"role": "assistant", "content": text, "tool_calls": []}
        obj = "chat.completion"
    else:
        choice["text"] = text
        obj = "text_completion"
    choice.update(logprobs=None, finish_reason=FINISH_LENGTH, stop_reason=None)
    body: dict[str, Any] = {
        "id": rid,
        "object": obj,
        "created": created,
        "model": req.model,
        "choices": [choice],
        "usage": usage(req.prompt_tokens, completion_tokens, cached_tokens),
    }
    if req.body.get("return_token_ids") is True:
        # vLLM's return_token_ids: the output's token ids on the choice, the prompt's
        # on the choice (completions) or the response (chat); null when not token ids
        choice["token_ids"] = [token_id(i) for i in range(completion_tokens)]
        prompt = None if req.prompt_token_ids is None else list(req.prompt_token_ids)
        (body if req.kind is ApiKind.CHAT else choice)["prompt_token_ids"] = prompt
    return body


def _chunk(req: GenerationRequest, rid: str, created: int, choices: list[Any]) -> dict[str, Any]:
    obj = "chat.completion.chunk" if req.kind is ApiKind.CHAT else "text_completion"
    return {"id": rid, "object": obj, "created": created, "model": req.model, "choices": choices}


def role_chunk(req: GenerationRequest, rid: str, created: int) -> dict[str, Any]:
    """The chat stream's first chunk: an empty assistant delta (vLLM sends it first)."""
    choice = {
        "index": 0,
        "delta": {"role": "assistant", "content": ""},
        "logprobs": None,
        "finish_reason": None,
    }
    return _chunk(req, rid, created, [choice])


def token_chunk(
    req: GenerationRequest, rid: str, created: int, index: int, last: bool
) -> dict[str, Any]:
    """The chunk carrying generated token ``index``; the last one has ``finish_reason``."""
    text = token_text(index)
    choice: dict[str, Any] = {"index": 0}
    if req.kind is ApiKind.CHAT:
        choice["delta"] = {"content": text}
    else:
        choice["text"] = text
    choice.update(logprobs=None, finish_reason=FINISH_LENGTH if last else None, stop_reason=None)
    return _chunk(req, rid, created, [choice])


def usage_chunk(
    req: GenerationRequest,
    rid: str,
    created: int,
    completion_tokens: int,
    cached_tokens: int | None = None,
) -> dict[str, Any]:
    """The ``include_usage`` chunk sent after the last token and before ``[DONE]``."""
    chunk = _chunk(req, rid, created, [])
    chunk["usage"] = usage(req.prompt_tokens, completion_tokens, cached_tokens)
    return chunk


def sse(obj: dict[str, Any]) -> bytes:
    """One server-sent event: ``data: <json>`` and a blank line."""
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def models_list(model: str, created: int, max_model_len: int) -> dict[str, Any]:
    """``GET /v1/models`` in vLLM's shape, listing the one served model."""
    card = {
        "id": model,
        "object": "model",
        "created": created,
        "owned_by": "vllm",
        "root": model,
        "parent": None,
        "max_model_len": max_model_len,
    }
    return {"object": "list", "data": [card]}


def json_response(obj: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(obj), status=status, content_type="application/json")


def error_response(exc: SimError) -> web.Response:
    """vLLM's error body with the error's status."""
    return json_response(exc.body(), status=exc.status)
