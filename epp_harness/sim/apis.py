"""The request APIs the simulator serves besides OpenAI completions and chat, as vLLM
(and, for ``/generate``, SGLang) serve them (pure, no I/O).

Each API turns its body into the completions or chat request the engine would make of
it (vLLM itself turns a Messages request into a chat request), so the engine, the KV
handoffs and the token counts are the ones completions and chat get; and it writes its
own response shapes, streamed or not:

* ``POST /v1/messages`` (Anthropic Messages): ``message_start``, ``content_block_*``,
  ``message_delta`` with the usage (``input_tokens`` without the cached ones,
  ``cache_read_input_tokens`` with prompt token details on), ``message_stop``; errors
  ``{"type": "error", "error": {...}}``. ``/v1/messages/count_tokens`` answers
  ``{"input_tokens": n}``.
* ``POST /v1/responses``: the response object (one output message, ``usage`` with
  ``input_tokens``, ``output_tokens``); streamed as ``response.created``,
  ``response.output_text.delta`` events and ``response.completed``.
* ``POST /v1/embeddings``: one vector per input (8 numbers), ``usage.prompt_tokens``.
* ``POST /inference/v1/generate`` (vLLM, token ids in and out): ``choices[].token_ids``,
  OpenAI ``usage``.
* ``POST /generate`` (SGLang): ``text``, ``output_ids``, ``meta_info`` with the counts.
"""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from epp.common.apis.anthropic import chat_body
from epp.errors import BadRequestError
from epp_harness.sim import responses
from epp_harness.sim.protocol import ApiKind, GenerationRequest, SimError, bad_request, is_int

Doc = dict[str, Any]


class SimApi:
    """OpenAI completions or chat; the other APIs override what differs."""

    # a body without ``model`` asks for the served one (the engines' generate APIs)
    model_optional = False

    def __init__(self, kind: ApiKind = ApiKind.COMPLETION) -> None:
        self.kind = kind

    def to_openai(self, doc: Doc) -> tuple[ApiKind, Doc]:
        """The completions or chat body the engine runs for ``doc``; SimError if bad."""
        return self.kind, doc

    def response_id(self, req: GenerationRequest) -> str:
        return responses.response_id(req)

    def full(
        self, req: GenerationRequest, rid: str, created: int, n: int, cached: int | None
    ) -> Doc:
        return responses.full_response(req, rid, created, n, cached)

    def first(self, req: GenerationRequest, rid: str, created: int) -> bytes:
        """Sent once the first token exists, before its own chunk."""
        if req.kind is ApiKind.CHAT:  # vLLM sends the role delta first
            return responses.sse(responses.role_chunk(req, rid, created))
        return b""

    def token(
        self, req: GenerationRequest, rid: str, created: int, index: int, last: bool
    ) -> bytes:
        return responses.sse(responses.token_chunk(req, rid, created, index, last))

    def end(
        self, req: GenerationRequest, rid: str, created: int, n: int, cached: int | None
    ) -> bytes:
        usage = b""
        if req.include_usage:
            usage = responses.sse(responses.usage_chunk(req, rid, created, n, cached))
        return usage + responses.SSE_DONE

    def error(self, exc: SimError) -> web.Response:
        return responses.error_response(exc)


def _event(name: str, data: Doc) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def _streamed(doc: Doc, body: Doc) -> Doc:
    """``body`` with the client's ``stream``, usage included in a stream's end."""
    stream = doc.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise bad_request("`stream` must be a boolean")
    if stream:
        body.update(stream=True, stream_options={"include_usage": True})
    return body


def _passed(doc: Doc, body: Doc, *keys: str) -> Doc:
    """``body`` with ``doc``'s ``model`` and the given keys (P/D fields) where set."""
    for key in ("model", "kv_transfer_params", *keys):
        if key in doc:
            body[key] = doc[key]
    return body


class Messages(SimApi):
    """Anthropic Messages, as vLLM serves it."""

    def __init__(self) -> None:
        super().__init__(ApiKind.CHAT)

    def to_openai(self, doc: Doc) -> tuple[ApiKind, Doc]:
        messages = doc.get("messages")
        if not isinstance(messages, list) or not messages:
            raise bad_request("`messages` must be a non-empty list")
        for i, m in enumerate(messages):
            content = m.get("content") if isinstance(m, dict) else None
            if not isinstance(content, str | list) or m.get("role") not in (
                "user",
                "assistant",
                "system",
            ):
                raise bad_request(f"`messages[{i}]` must have a role and a content")
            if isinstance(content, list) and not all(
                isinstance(b, dict) and isinstance(b.get("type"), str) for b in content
            ):
                raise bad_request(f"`messages[{i}].content` must be a list of content blocks")
        if "max_tokens" not in doc:
            raise bad_request("`max_tokens` is required")
        try:
            chat = chat_body(doc) or {"messages": [m for m in messages if isinstance(m, dict)]}
        except BadRequestError as exc:  # a system prompt that is not one
            raise bad_request(exc.message) from None
        body = _passed(doc, {"messages": chat["messages"], "max_tokens": doc["max_tokens"]})
        return ApiKind.CHAT, _streamed(doc, body)

    def _usage(self, req: GenerationRequest, n: int, cached: int | None) -> Doc:
        usage: Doc = {"input_tokens": req.prompt_tokens - (cached or 0), "output_tokens": n}
        if cached is not None:
            usage["cache_read_input_tokens"] = cached
        return usage

    def _message(self, req: GenerationRequest, rid: str, content: list[Doc]) -> Doc:
        return {
            "id": rid,
            "type": "message",
            "role": "assistant",
            "content": content,
            "model": req.model,
            "stop_reason": None,
            "stop_sequence": None,
        }

    def full(
        self, req: GenerationRequest, rid: str, created: int, n: int, cached: int | None
    ) -> Doc:
        message = self._message(req, rid, [{"type": "text", "text": responses.generated_text(n)}])
        message.update(stop_reason="max_tokens", usage=self._usage(req, n, cached))
        return message

    def first(self, req: GenerationRequest, rid: str, created: int) -> bytes:
        message = self._message(req, rid, [])
        message["usage"] = {"input_tokens": req.prompt_tokens, "output_tokens": 0}
        block = {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "text", "text": ""},
        }
        return _event("message_start", {"type": "message_start", "message": message}) + _event(
            "content_block_start", block
        )

    def token(
        self, req: GenerationRequest, rid: str, created: int, index: int, last: bool
    ) -> bytes:
        delta = {"type": "text_delta", "text": responses.token_text(index)}
        return _event(
            "content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}
        )

    def end(
        self, req: GenerationRequest, rid: str, created: int, n: int, cached: int | None
    ) -> bytes:
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": "max_tokens", "stop_sequence": None},
            "usage": self._usage(req, n, cached),
        }
        return (
            _event("content_block_stop", {"type": "content_block_stop", "index": 0})
            + _event("message_delta", delta)
            + _event("message_stop", {"type": "message_stop"})
        )

    def error(self, exc: SimError) -> web.Response:
        # vLLM wraps its own error type and message in Anthropic's envelope
        inner = exc.body()["error"]
        body = {"type": "error", "error": {"type": inner["type"], "message": exc.message}}
        return responses.json_response(body, status=exc.status)


class Responses(SimApi):
    """OpenAI Responses, minimal: text in, one output message out."""

    def __init__(self) -> None:
        super().__init__(ApiKind.CHAT)

    def to_openai(self, doc: Doc) -> tuple[ApiKind, Doc]:
        messages: list[Doc] = []
        instructions = doc.get("instructions")
        if isinstance(instructions, str):
            messages.append({"role": "system", "content": instructions})
        items = doc.get("input")
        if isinstance(items, str):
            messages.append({"role": "user", "content": items})
        elif isinstance(items, list) and all(isinstance(i, dict) for i in items):
            for item in items:
                content = item.get("content")
                if isinstance(content, list):  # input_text parts
                    content = "".join(
                        str(p.get("text", "")) for p in content if isinstance(p, dict)
                    )
                messages.append({"role": str(item.get("role", "user")), "content": content or ""})
        if not messages or not isinstance(items, str | list):
            raise bad_request("`input` must be a string or a list of input items")
        body: Doc = {"messages": messages}
        if "max_output_tokens" in doc:
            body["max_tokens"] = doc["max_output_tokens"]
        return ApiKind.CHAT, _streamed(doc, _passed(doc, body))

    def response_id(self, req: GenerationRequest) -> str:
        return "resp_" + req.request_id

    def _response(self, req: GenerationRequest, rid: str, created: int, text: str) -> Doc:
        item = {"type": "output_text", "text": text, "annotations": []}
        message = {
            "type": "message",
            "id": "msg_" + req.request_id,
            "status": "completed",
            "role": "assistant",
            "content": [item],
        }
        return {
            "id": rid,
            "object": "response",
            "created_at": created,
            "model": req.model,
            "status": "completed",
            "output": [message],
        }

    def full(
        self, req: GenerationRequest, rid: str, created: int, n: int, cached: int | None
    ) -> Doc:
        body = self._response(req, rid, created, responses.generated_text(n))
        body["usage"] = {  # last: a stream's tail holds it
            "input_tokens": req.prompt_tokens,
            "input_tokens_details": {"cached_tokens": cached or 0},
            "output_tokens": n,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": req.prompt_tokens + n,
        }
        return body

    def first(self, req: GenerationRequest, rid: str, created: int) -> bytes:
        started = self._response(req, rid, created, "")
        started.update(status="in_progress", output=[])
        return _event("response.created", {"type": "response.created", "response": started})

    def token(
        self, req: GenerationRequest, rid: str, created: int, index: int, last: bool
    ) -> bytes:
        delta = {
            "type": "response.output_text.delta",
            "item_id": "msg_" + req.request_id,
            "output_index": 0,
            "content_index": 0,
            "delta": responses.token_text(index),
            "sequence_number": index + 1,
        }
        return _event("response.output_text.delta", delta)

    def end(
        self, req: GenerationRequest, rid: str, created: int, n: int, cached: int | None
    ) -> bytes:
        done = {"type": "response.completed", "response": self.full(req, rid, created, n, cached)}
        return _event("response.completed", done)


class Embeddings(SimApi):
    """OpenAI embeddings: the input prefilled, nothing generated."""

    WIDTH = 8

    def to_openai(self, doc: Doc) -> tuple[ApiKind, Doc]:
        value = doc.get("input")
        if isinstance(value, str) and value:
            inputs = 1
        elif isinstance(value, list) and value and all(isinstance(v, str) for v in value):
            inputs = len(value)
        elif isinstance(value, list) and value and all(is_int(v) for v in value):
            inputs = 1
        else:
            raise bad_request("`input` must be a string, a list of strings or token ids")
        return ApiKind.COMPLETION, _passed(
            doc, {"prompt": value, "max_tokens": 1, "sim_inputs": inputs}
        )

    def full(
        self, req: GenerationRequest, rid: str, created: int, n: int, cached: int | None
    ) -> Doc:
        count = int(req.body.get("sim_inputs", 1))
        data = [
            {"object": "embedding", "index": i, "embedding": [0.125 * (i + 1)] * self.WIDTH}
            for i in range(count)
        ]
        usage = {"prompt_tokens": req.prompt_tokens, "total_tokens": req.prompt_tokens}
        return {"id": "embd-" + req.request_id, "object": "list", "created": created,
                "model": req.model, "data": data, "usage": usage}  # fmt: skip


class VllmGenerate(SimApi):
    """vLLM's ``/inference/v1/generate``: token ids in, token ids out."""

    model_optional = True

    def to_openai(self, doc: Doc) -> tuple[ApiKind, Doc]:
        ids = doc.get("token_ids")
        if not isinstance(ids, list) or not ids or not all(is_int(i) and i >= 0 for i in ids):
            raise bad_request("`token_ids` must be a non-empty list of non-negative integers")
        params = doc.get("sampling_params")
        if params is not None and not isinstance(params, dict):
            raise bad_request("`sampling_params` must be an object")
        body = _passed(doc, {"prompt": ids}, "stream", "stream_options")
        if params and "max_tokens" in params:
            body["max_tokens"] = params["max_tokens"]
        return ApiKind.COMPLETION, body

    def _choice(self, first: int, n: int, finish: str | None) -> Doc:
        ids = [responses.token_id(i) for i in range(first, first + n)]
        return {"index": 0, "token_ids": ids, "finish_reason": finish, "stop_reason": None}

    def full(
        self, req: GenerationRequest, rid: str, created: int, n: int, cached: int | None
    ) -> Doc:
        return {
            "request_id": req.request_id,
            "model": req.model,
            "created": created,
            "output_mode": "tokens",
            "choices": [self._choice(0, n, responses.FINISH_LENGTH)],
            "usage": responses.usage(req.prompt_tokens, n, cached),
        }

    def first(self, req: GenerationRequest, rid: str, created: int) -> bytes:
        return b""

    def token(
        self, req: GenerationRequest, rid: str, created: int, index: int, last: bool
    ) -> bytes:
        finish = responses.FINISH_LENGTH if last else None
        chunk = {"request_id": req.request_id, "output_mode": "tokens",
                 "choices": [self._choice(index, 1, finish)]}  # fmt: skip
        return responses.sse(chunk)

    def end(
        self, req: GenerationRequest, rid: str, created: int, n: int, cached: int | None
    ) -> bytes:
        usage = b""
        if req.include_usage:
            chunk = {"request_id": req.request_id, "output_mode": "tokens", "choices": [],
                     "usage": responses.usage(req.prompt_tokens, n, cached)}  # fmt: skip
            usage = responses.sse(chunk)
        return usage + responses.SSE_DONE


class SglangGenerate(SimApi):
    """SGLang's ``/generate``: token ids or text in; counts in ``meta_info``."""

    model_optional = True

    def to_openai(self, doc: Doc) -> tuple[ApiKind, Doc]:
        ids, text = doc.get("input_ids"), doc.get("text")
        if ids is not None:
            batch = ids if isinstance(ids, list) and ids and isinstance(ids[0], list) else [ids]
            if not all(
                isinstance(p, list) and p and all(is_int(i) and i >= 0 for i in p) for p in batch
            ):
                raise bad_request("`input_ids` must be non-negative integers")
            prompt: Any = [i for p in batch for i in p]
        elif isinstance(text, str) and text:
            prompt = text
        else:
            raise bad_request("give `input_ids` or `text`")
        params = doc.get("sampling_params") or {}
        if not isinstance(params, dict):
            raise bad_request("`sampling_params` must be an object")
        body = _passed(doc, {"prompt": prompt}, "stream")
        if "max_new_tokens" in params:
            body["max_tokens"] = params["max_new_tokens"]
        return ApiKind.COMPLETION, body

    def _meta(self, req: GenerationRequest, n: int, cached: int | None, done: bool) -> Doc:
        finish = {"type": "length", "length": n} if done else None
        return {"id": req.request_id, "finish_reason": finish, "prompt_tokens": req.prompt_tokens,
                "completion_tokens": n, "cached_tokens": cached or 0}  # fmt: skip

    def full(
        self, req: GenerationRequest, rid: str, created: int, n: int, cached: int | None
    ) -> Doc:
        ids = [responses.token_id(i) for i in range(n)]
        text = responses.generated_text(n)
        return {"text": text, "output_ids": ids, "meta_info": self._meta(req, n, cached, True)}

    def first(self, req: GenerationRequest, rid: str, created: int) -> bytes:
        return b""

    def token(
        self, req: GenerationRequest, rid: str, created: int, index: int, last: bool
    ) -> bytes:
        # SGLang streams the text so far; the counts of the last chunk are final (the
        # cached tokens are only known at the end here: 0 before)
        chunk = {"text": responses.generated_text(index + 1),
                 "output_ids": [responses.token_id(index)],
                 "meta_info": self._meta(req, index + 1, None, False)}  # fmt: skip
        return b"" if last else responses.sse(chunk)

    def end(
        self, req: GenerationRequest, rid: str, created: int, n: int, cached: int | None
    ) -> bytes:
        chunk = {"text": responses.generated_text(n), "output_ids": [responses.token_id(n - 1)],
                 "meta_info": self._meta(req, n, cached, True)}  # fmt: skip
        return responses.sse(chunk) + responses.SSE_DONE

    def error(self, exc: SimError) -> web.Response:
        inner = exc.body()["error"]
        body = {"object": "error", "message": exc.message, "type": inner["type"],
                "param": None, "code": exc.status}  # fmt: skip
        return responses.json_response(body, status=exc.status)


def count_tokens_body(req: GenerationRequest) -> Doc:
    """``/v1/messages/count_tokens``' answer."""
    return {"input_tokens": req.prompt_tokens}
