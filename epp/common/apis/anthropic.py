"""Anthropic's Messages API (pure): ``/v1/messages`` and ``/v1/messages/count_tokens``,
as vLLM serves them.

The prompt text puts what every turn of an agent repeats first: the system prompt, the
tool definitions, then the messages as ``role: text`` lines (text blocks, tool calls
with their input, tool results, thinking). A system block that starts with
``x-anthropic-billing-header`` is left out, as vLLM leaves it out of the engine's
prompt: it carries a hash that changes with every request. ``count_tokens`` is parsed
and checked alike but gives no prompt to route by: it generates nothing, and no
server caches what it counted.

Errors take Anthropic's shape: ``{"type": "error", "error": {"type", "message"}}``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import orjson

from epp.common.apis.base import Api, Read, bad, json_kind, json_text, positive_int
from epp.common.usage import Usage, cached_within, first_object, last_object
from epp.errors import ClientVisibleError, PrefillRejectedError

MESSAGES = "/v1/messages"
COUNT_TOKENS = "/v1/messages/count_tokens"
BILLING_HEADER = "x-anthropic-billing-header"
_ROLES = frozenset({"user", "assistant", "system"})
# Anthropic's error types by HTTP status
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def error_body(error: ClientVisibleError) -> bytes:
    """Anthropic's error body for ``error`` (a prefill server's own error relayed)."""
    if isinstance(error, PrefillRejectedError):
        return error.body()
    kind = _ERROR_TYPES.get(error.status, "api_error")
    return orjson.dumps({"type": "error", "error": {"type": kind, "message": error.message}})


def _read_messages(doc: Mapping[str, Any]) -> Read:
    prompt = _prompt(doc)
    limit = doc.get("max_tokens")
    if positive_int(limit) is None:
        raise bad(f"'max_tokens' must be an integer above 0, got {json_kind(limit)}")
    stream = doc.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise bad(f"'stream' must be a boolean, got {json_kind(stream)}")
    return Read(prompt, None, stream is True, limit)


def _read_count_tokens(doc: Mapping[str, Any]) -> Read:
    _prompt(doc)  # checked, not routed by
    return Read("", None, False, None)


def _prompt(doc: Mapping[str, Any]) -> str:
    """The prompt text (module docstring); a BadRequestError for a body that is not a
    Messages request."""
    lines = []
    system = doc.get("system")
    if system is not None:
        lines.append(f"system: {_system_text(system, 'system')}\n")
    tools = doc.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise bad(f"'tools' must be an array, got {json_kind(tools)}")
        for i, tool in enumerate(tools):
            if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
                raise bad(f"'tools[{i}]' must be an object with a string 'name'")
            description = tool.get("description")
            described = description if isinstance(description, str) else ""
            schema = json_text(tool.get("input_schema"))
            lines.append(f"tool: {tool['name']} {described} {schema}\n")
    messages = doc.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad(f"'messages' must be a non-empty array, got {json_kind(messages)}")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in _ROLES:
            raise bad(f"'messages[{i}]' must be an object with 'role' user, assistant or system")
        lines.append(f"{message['role']}: {_content_text(message.get('content'), i)}\n")
    return "".join(lines)


def _system_text(system: Any, where: str) -> str:
    if isinstance(system, str):
        return "" if system.startswith(BILLING_HEADER) else system
    if not isinstance(system, list):
        raise bad(f"'{where}' must be a string or an array of text blocks")
    parts = []
    for j, block in enumerate(system):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise bad(f"'{where}[{j}]' must be a content block with a string 'type'")
        text = block.get("text")
        if isinstance(text, str) and not text.startswith(BILLING_HEADER):
            parts.append(text)
    return "".join(parts)


def _content_text(content: Any, i: int) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad(f"'messages[{i}].content' must be a string or an array of content blocks")
    parts = []
    for j, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise bad(f"'messages[{i}].content[{j}]' must be a content block with a string 'type'")
        kind = block["type"]
        if kind == "tool_use":
            parts.append(f"{block.get('name', '')} {json_text(block.get('input'))}")
        elif kind == "tool_result":
            result = block.get("content")
            parts.append(result if isinstance(result, str) else "".join(_texts(result)))
        else:  # text, thinking; an image's bytes are not what a prefix cache keys on
            text = block.get("text", block.get("thinking"))
            if isinstance(text, str):
                parts.append(text)
    return "".join(parts)


def usage(head: bytes, tail: bytes) -> Usage | None:
    """Usage from a Messages response: the last ``usage`` (the body's, or a stream's
    ``message_delta`` with the cumulative ``output_tokens``); the prompt's tokens from it
    or, when it has no ``input_tokens``, from the stream's ``message_start`` (in
    ``head``). Anthropic counts cached tokens apart: the prompt is ``input_tokens`` +
    ``cache_read_input_tokens`` + ``cache_creation_input_tokens``."""
    last = last_object(tail, b'"usage"')
    if last is None:
        return None
    completion = last.get("output_tokens")
    if not isinstance(completion, int) or isinstance(completion, bool):
        return None
    counts = last if "input_tokens" in last else first_object(head, b'"usage"')
    if counts is None:
        return None
    fields = (
        counts.get(k, 0)
        for k in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
    )
    uncached, read, created = (v if isinstance(v, int) and v >= 0 else -1 for v in fields)
    if min(uncached, read, created) < 0:
        return None
    prompt = uncached + read + created
    cached = counts.get("cache_read_input_tokens")
    return Usage(prompt, completion, cached_within(cached, prompt))


def chat_body(doc: Mapping[str, Any]) -> dict[str, Any] | None:
    """The OpenAI chat request vLLM turns a Messages request into before its chat
    template renders it (system first, tool calls and results as chat messages, tools
    as functions); None when it holds what a tokenizer cannot reproduce (images)."""
    chat: list[dict[str, Any]] = []
    system = doc.get("system")
    if system is not None:
        text = _system_text(system, "system")
        if text:
            chat.append({"role": "system", "content": text})
    for message in doc.get("messages") or ():
        converted = _chat_messages(message)
        if converted is None:
            return None
        chat.extend(converted)
    body: dict[str, Any] = {"messages": chat}
    tools = doc.get("tools")
    if isinstance(tools, list) and tools:
        body["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": t.get("name"),
                    "description": t.get("description"),
                    "parameters": t.get("input_schema"),
                },
            }
            for t in tools
            if isinstance(t, dict)
        ]
    for key in ("chat_template_kwargs", "add_generation_prompt"):
        if key in doc:
            body[key] = doc[key]
    return body


def _chat_messages(message: Any) -> list[dict[str, Any]] | None:
    role, content = message.get("role"), message.get("content")
    if role == "system":
        text = _system_text(content, "system")
        return [{"role": "system", "content": text}] if text else []
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    for block in content:
        kind = block.get("type")
        if kind == "text" and block.get("text"):
            texts.append(block["text"])
        elif kind == "tool_use":
            arguments = json.dumps(block.get("input") or {})
            function = {"name": block.get("name") or "", "arguments": arguments}
            calls.append({"id": block.get("id"), "type": "function", "function": function})
        elif kind == "tool_result" and role == "user":
            result = block.get("content")
            text = result if isinstance(result, str) else "\n".join(_texts(result))
            results.append(
                {"role": "tool", "tool_call_id": block.get("tool_use_id") or "", "content": text}
            )
        elif kind == "image" or kind == "tool_result":
            return None
    out: dict[str, Any] = {"role": role}
    if calls:
        out["tool_calls"] = calls
    if texts:
        out["content"] = (
            texts[0] if len(texts) == 1 else [{"type": "text", "text": t} for t in texts]
        )
    return results + ([out] if texts or calls else [])


def _texts(blocks: Any) -> list[str]:
    """The texts of a block list's text blocks."""
    if not isinstance(blocks, list):
        return []
    return [
        b["text"]
        for b in blocks
        if isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str)
    ]


MESSAGES_API = Api("anthropic-parser", _read_messages, usage, error_body, needs_head=True)
COUNT_TOKENS_API = Api("anthropic-parser", _read_count_tokens, usage, error_body)
