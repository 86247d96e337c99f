"""Find the OpenAI ``usage`` object at the end of a response body (pure).

Non-streaming responses carry it in the JSON body; SSE streams carry it in the last
data event when ``stream_options.include_usage`` is set. Either way it sits near the end,
so the Envoy adapter only keeps the body's tail.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

TAIL_BYTES = 4096
_DECODER = json.JSONDecoder()


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    # prompt tokens the server served from its prefix cache, when it says
    # (``prompt_tokens_details.cached_tokens``, vLLM with --enable-prompt-tokens-details)
    cached_tokens: int | None = None


class Tail:
    """The last TAIL_BYTES of a body that passes chunk by chunk, kept for the price of
    appending each chunk: the buffer is cut back only
    once it holds twice that, so a stream of small chunks copies 4 KB once per 4 KB of
    body rather than once per chunk."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = bytearray()

    def add(self, chunk: bytes) -> None:
        buf = self._buf
        if len(chunk) >= TAIL_BYTES:  # a long chunk replaces it all (not copied whole)
            buf[:] = memoryview(chunk)[-TAIL_BYTES:]
            return
        buf += chunk
        if len(buf) > 2 * TAIL_BYTES:
            del buf[:-TAIL_BYTES]

    def bytes(self) -> bytes:
        """The last TAIL_BYTES seen (all of it, if less)."""
        return bytes(self._buf[-TAIL_BYTES:])


def find_usage(tail: bytes) -> Usage | None:
    """The last ``"usage": {...}`` object in ``tail`` (OpenAI's names), or None if
    absent or malformed."""
    return usage_named(tail, "prompt_tokens", "completion_tokens", "prompt_tokens_details")


def usage_named(
    tail: bytes, prompt_key: str, completion_key: str, details_key: str
) -> Usage | None:
    """The last ``"usage": {...}`` object in ``tail`` with its counts under these names
    (the cached ones under ``details_key``'s ``cached_tokens``), or None if absent or
    malformed."""
    obj = last_object(tail, b'"usage"')
    if obj is None:
        return None
    prompt, completion = obj.get(prompt_key), obj.get(completion_key)
    if not isinstance(prompt, int) or not isinstance(completion, int):
        return None
    details = obj.get(details_key)
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return Usage(prompt, completion, cached_within(cached, prompt))


def cached_within(cached: object, prompt: int) -> int | None:
    """``cached`` when it is a count of tokens within ``prompt``, else None."""
    if not isinstance(cached, int) or isinstance(cached, bool) or not 0 <= cached <= prompt:
        return None
    return cached


def last_object(data: bytes, key: bytes) -> dict[str, Any] | None:
    """The JSON object after the last ``key`` (a quoted name) in ``data``, or None."""
    return _object_at(data, data.rfind(key), key)


def first_object(data: bytes, key: bytes) -> dict[str, Any] | None:
    """The JSON object after the first ``key`` (a quoted name) in ``data``, or None."""
    return _object_at(data, data.find(key), key)


def _object_at(data: bytes, idx: int, key: bytes) -> dict[str, Any] | None:
    if idx < 0:
        return None
    text = data[idx + len(key) :].decode("utf-8", errors="replace").lstrip()
    if not text.startswith(":"):
        return None
    try:
        obj, _ = _DECODER.raw_decode(text[1:].lstrip())
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None
