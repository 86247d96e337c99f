"""Parse OpenAI completions / chat requests into GenerationRequest (pure, no I/O).

Validation follows vLLM where it matters to a router: a bad body is a 400, a model the
server does not serve is a 404 ("The model `x` does not exist."), and ``stream_options``
without ``stream: true`` is rejected (the reason P/D prefill rewrites must drop it).
"""

from __future__ import annotations

import os
from collections.abc import Container
from dataclasses import dataclass
from enum import StrEnum
from http import HTTPStatus
from typing import Any, TypeGuard

import orjson

from epp_harness.sim.chunk_tokenizer import count_tokens

# No real model can generate more in one request; it also bounds the work a single
# non-streaming request can make the simulator do.
MAX_TOKENS_LIMIT = 131_072


class ApiKind(StrEnum):
    """Which OpenAI endpoint a request came in on (decides the response shape)."""

    COMPLETION = "completion"
    CHAT = "chat"


class SimError(Exception):
    """An error answered to the client as vLLM does: ``{"error": {...}}`` with a status."""

    def __init__(self, status: int, message: str, err_type: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.err_type = err_type  # vLLM's own type for some errors ("InvalidUserInput")

    def body(self) -> dict[str, Any]:
        # vLLM names the type after the status ("BadRequestError", "NotFoundError") and
        # repeats the status as the code.
        phrase = HTTPStatus(self.status).phrase.replace(" ", "").replace("-", "")
        return {
            "error": {
                "message": self.message,
                "type": self.err_type or f"{phrase}Error",
                "param": None,
                "code": self.status,
            }
        }


def bad_request(message: str) -> SimError:
    return SimError(400, message)


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """One validated generation request; ``body`` keeps the parsed JSON for later hooks.

    The prompt is ``prompt_text`` or, for token-id prompts, ``prompt_token_ids``;
    ``prompt_tokens`` is its length in simulated tokens.
    """

    kind: ApiKind
    model: str
    prompt_text: str
    prompt_token_ids: tuple[int, ...] | None
    prompt_tokens: int
    max_tokens: int
    stream: bool
    include_usage: bool
    request_id: str
    body: dict[str, Any]


def text_tokens(text: str) -> int:
    """Simulated token count of a text without KV events: ceil(chars / 4), the count
    of epp_harness.sim.chunk_tokenizer (whose files a client can load)."""
    return count_tokens(text)


def is_int(value: object) -> TypeGuard[int]:
    """A JSON integer (booleans are ints in Python, not in JSON)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _completion_prompt(prompt: object) -> tuple[str, tuple[int, ...] | None]:
    """Text or token ids of a completions ``prompt``; lists are concatenated into one."""
    if isinstance(prompt, str):
        if not prompt:
            raise bad_request("`prompt` must not be empty")
        return prompt, None
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return "".join(prompt), None
        if all(is_int(p) for p in prompt):
            return "", tuple(prompt)
        if all(isinstance(p, list) and p and all(is_int(t) for t in p) for p in prompt):
            return "", tuple(t for p in prompt for t in p)
    raise bad_request(
        "`prompt` must be a non-empty string, list of strings, list of token ids "
        "or list of token-id lists"
    )


def _message_text(index: int, message: object) -> str:
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise bad_request(f"`messages[{index}]` must be an object with a string `role`")
    content = message.get("content")
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        # Only text parts count towards the prompt; other parts (images...) are ignored.
        texts = [
            part["text"]
            for part in content
            if isinstance(part, dict) and part.get("type") == "text"
            if isinstance(part.get("text"), str)
        ]
        return "".join(texts)
    raise bad_request(f"`messages[{index}].content` must be a string, a list of parts or null")


def _chat_prompt(messages: object) -> str:
    if not isinstance(messages, list) or not messages:
        raise bad_request("`messages` must be a non-empty list")
    return "".join(_message_text(i, m) for i, m in enumerate(messages))


def _max_tokens(body: dict[str, Any], default: int) -> int:
    # max_completion_tokens is the newer OpenAI name; vLLM prefers it when both are set.
    for name in ("max_completion_tokens", "max_tokens"):
        value = body.get(name)
        if value is None:
            continue
        if not is_int(value) or not 1 <= value <= MAX_TOKENS_LIMIT:
            raise bad_request(f"`{name}` must be an integer between 1 and {MAX_TOKENS_LIMIT}")
        return int(value)
    return default


def _stream_flags(body: dict[str, Any]) -> tuple[bool, bool]:
    stream = body.get("stream")
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise bad_request("`stream` must be a boolean")
    options = body.get("stream_options")
    if options is None:
        return stream, False
    if not stream:
        raise bad_request("Stream options can only be defined when `stream=True`.")
    if not isinstance(options, dict):
        raise bad_request("`stream_options` must be an object")
    include_usage = options.get("include_usage")
    if include_usage is not None and not isinstance(include_usage, bool):
        raise bad_request("`stream_options.include_usage` must be a boolean")
    return stream, bool(include_usage)


def parse_request(
    kind: ApiKind,
    raw: bytes,
    *,
    served_model: str,
    default_max_tokens: int,
    request_id: str | None = None,
    adapters: Container[str] = (),
) -> GenerationRequest:
    """Validate a raw request body; raise SimError (400 / 404) when it cannot be served.

    ``request_id`` (the client's ``x-request-id``) becomes the response id's suffix, as
    in vLLM; without it a random one is made. ``adapters``: LoRA adapter names also
    served.
    """
    return parse_doc(
        kind,
        load_object(raw),
        served_model=served_model,
        default_max_tokens=default_max_tokens,
        request_id=request_id,
        adapters=adapters,
    )


def load_object(raw: bytes) -> dict[str, Any]:
    """A request body's JSON object; SimError 400 when it is not one."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise bad_request(f"Invalid JSON body: {exc}") from None
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object")
    return body


def parse_doc(
    kind: ApiKind,
    body: dict[str, Any],
    *,
    served_model: str,
    default_max_tokens: int,
    request_id: str | None = None,
    adapters: Container[str] = (),
) -> GenerationRequest:
    """:func:`parse_request` of a decoded body (the other APIs' requests, turned into
    the completions or chat request the engine would make of them, come here)."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("`model` is required and must be a non-empty string")
    if model != served_model and model not in adapters:
        raise SimError(404, f"The model `{model}` does not exist.")
    token_ids: tuple[int, ...] | None = None
    if kind is ApiKind.CHAT:
        text = _chat_prompt(body.get("messages"))
    else:
        if "prompt" not in body:
            raise bad_request("`prompt` is required")
        text, token_ids = _completion_prompt(body["prompt"])
    max_tokens = _max_tokens(body, default_max_tokens)
    stream, include_usage = _stream_flags(body)
    return GenerationRequest(
        kind=kind,
        model=model,
        prompt_text=text,
        prompt_token_ids=token_ids,
        prompt_tokens=len(token_ids) if token_ids is not None else text_tokens(text),
        max_tokens=max_tokens,
        stream=stream,
        include_usage=include_usage,
        request_id=request_id or os.urandom(16).hex(),
        body=body,
    )
