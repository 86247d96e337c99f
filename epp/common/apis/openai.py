"""OpenAI's APIs (pure): completions and chat (also what an unknown path's JSON body is
read as), Responses and embeddings.

The prompt is one string: completions' ``prompt`` (strings joined, or token ids as
:func:`token_id_prompt` spells them), chat ``messages`` as ``role: content`` lines (roles
are part of what a server caches), Responses' ``instructions`` and ``input`` items
alike, embeddings' ``input``.
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping
from typing import Any

from epp.common.apis.base import Api, Read, openai_error, openai_usage, positive_int, stream_flag
from epp.common.usage import Usage, last_object, usage_named
from epp.types import CHARS_PER_TOKEN

# characters a token id is spelled in, in a prompt's text (what the prefix index hashes:
# its blocks, sized for 4 characters a token, then hold whole ids)
TOKEN_ID_CHARS = CHARS_PER_TOKEN


def parse_prompt(doc: Mapping[str, Any]) -> tuple[str, int | None]:
    """The prompt as one string, and its tokens when known exactly (None: to be
    estimated from the string's length): completions' ``prompt`` (strings joined, or
    token ids as :func:`token_id_prompt` reads them), or chat ``messages`` as ``role:
    content`` lines (roles are part of what a server caches)."""
    prompt = doc.get("prompt")
    if prompt is not None:
        ids = token_id_prompt(prompt)
        return (text_of(prompt), None) if ids is None else ids
    messages = doc.get("messages")
    if isinstance(messages, list):
        text = "".join(
            f"{m.get('role', '')}: {text_of(m.get('content'))}\n"
            for m in messages
            if isinstance(m, dict)
        )
        return text, None
    return "", None


def token_id_prompt(value: Any) -> tuple[str, int] | None:
    """A prompt of token ids (a list of integers, or a batch: a list of such lists) as
    (text, count): the text spells each id in ``TOKEN_ID_CHARS`` characters, the count
    is exact (a batch's ids all count). None when ``value`` is not one. Every parser of
    a token-id prompt reads it here, so its tokens are counted, never estimated."""
    if not isinstance(value, list) or not value:
        return None
    batch = value if isinstance(value[0], list) else [value]
    count = 0
    for ids in batch:
        if not isinstance(ids, list):
            return None
        try:  # every one an integer (checked in C: a prompt may hold many thousands)
            array("q", ids)
        except (TypeError, OverflowError):
            return None
        count += len(ids)
    return "".join(id_text(ids) for ids in batch), count


def id_text(ids: list[int]) -> str:
    return "".join([f"{i % 10000:04d}" for i in ids])


def text_of(value: Any) -> str:
    """The text of a content value: a string, or the text of a list's parts."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = []
        for item in value:
            if isinstance(item, int):
                parts.append(id_text([item]))
            elif isinstance(item, dict):  # chat content parts
                parts.append(text_of(item.get("text")))
            else:
                parts.append(text_of(item))
        return "".join(parts)
    return ""


def max_tokens(doc: Mapping[str, Any]) -> int | None:
    for key in ("max_completion_tokens", "max_tokens"):
        value = positive_int(doc.get(key))
        if value is not None:
            return value
    return None


def _read(doc: Mapping[str, Any]) -> Read:
    prompt, count = parse_prompt(doc)
    return Read(prompt, count, stream_flag(doc), max_tokens(doc))


def _read_responses(doc: Mapping[str, Any]) -> Read:
    """Responses: ``instructions`` as the system's line, then ``input`` (a string, or
    items: messages with text parts, tool calls' arguments and outputs)."""
    lines = []
    instructions = doc.get("instructions")
    if isinstance(instructions, str):
        lines.append(f"system: {instructions}\n")
    items = doc.get("input")
    if isinstance(items, str):
        lines.append(f"user: {items}\n")
    elif isinstance(items, list):
        for item in items:
            if not isinstance(item, dict):
                continue
            role = item.get("role") or item.get("type") or ""
            content = item.get("content", item.get("arguments", item.get("output")))
            lines.append(f"{role}: {text_of(content)}\n")
    limit = positive_int(doc.get("max_output_tokens"))
    return Read("".join(lines), None, stream_flag(doc), limit)


def _read_embeddings(doc: Mapping[str, Any]) -> Read:
    """Embeddings: ``input``, text or token ids; nothing is generated."""
    value = doc.get("input")
    ids = token_id_prompt(value)
    prompt, count = (text_of(value), None) if ids is None else ids
    return Read(prompt, count, False, None)


def _responses_usage(head: bytes, tail: bytes) -> Usage | None:
    """Responses' ``usage``: ``input_tokens`` (cached ones included, counted in
    ``input_tokens_details.cached_tokens``), ``output_tokens``."""
    return usage_named(tail, "input_tokens", "output_tokens", "input_tokens_details")


def _embeddings_usage(head: bytes, tail: bytes) -> Usage | None:
    """Embeddings' ``usage``: ``prompt_tokens`` only (nothing generated)."""
    obj = last_object(tail, b'"usage"')
    prompt = None if obj is None else obj.get("prompt_tokens")
    if not isinstance(prompt, int) or isinstance(prompt, bool):
        return None
    return Usage(prompt, 0)


# completions, chat, and any path without an API of its own
OPENAI = Api("openai-parser", _read, openai_usage, openai_error)
RESPONSES = Api("openai-parser", _read_responses, _responses_usage, openai_error)
EMBEDDINGS = Api("openai-parser", _read_embeddings, _embeddings_usage, openai_error)
