"""Turn a request's headers and raw body into an :class:`InferenceRequest` (pure).

The body is parsed exactly once, here. Anything wrong with it raises a
:class:`BadRequestError` whose message says precisely what.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Mapping
from typing import Any

import orjson

from epp.errors import BadRequestError
from epp.types import CHARS_PER_TOKEN, InferenceRequest


def parse_request(
    request_id: str,
    headers: Mapping[str, str],
    body: bytes | None,
    subset: frozenset[str] | None = None,
    chars_per_token: float = CHARS_PER_TOKEN,
) -> tuple[InferenceRequest, dict[str, Any] | None]:
    """Parse an OpenAI-style request; returns it with the decoded JSON body (None when
    the request has no body, e.g. ``GET /v1/models``). ``chars_per_token``: what its
    prompt's token estimate divides by (the ratio learned so far)."""
    path = headers.get(":path", "/").split("?", 1)[0]
    if body is None:
        request = InferenceRequest(
            request_id=request_id, model=None, path=path, headers=headers, subset=subset
        )
        return request, None
    if not body:
        raise BadRequestError("request body is empty: expected a JSON object", code="empty_body")
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadRequestError(
            f"request body is not valid JSON: {exc}", code="invalid_json"
        ) from None
    if not isinstance(doc, dict):
        raise BadRequestError(
            f"request body must be a JSON object, got {_json_kind(doc)}", code="invalid_body"
        )
    slo_ttft, slo_tpot = slo_targets(headers)
    model = doc.get("model")
    if model is None:
        raise BadRequestError("request body has no 'model' field", code="missing_model")
    if not isinstance(model, str) or not model:
        raise BadRequestError(
            f"'model' must be a non-empty string, got {_json_kind(model)}", code="invalid_model"
        )
    prompt, token_count = parse_prompt(doc)
    if token_count is not None:  # its text spells each id in TOKEN_ID_CHARS characters
        chars_per_token = TOKEN_ID_CHARS
    return (
        InferenceRequest(
            request_id=request_id,
            model=model,
            path=path,
            prompt=prompt,
            stream=doc.get("stream") is True,
            max_tokens=_max_tokens(doc),
            headers=headers,
            subset=subset,
            slo_ttft_ms=slo_ttft,
            slo_tpot_ms=slo_tpot,
            body=doc,
            chars_per_token=chars_per_token,
            prompt_token_count=token_count,
        ),
        doc,
    )


# Latency objectives as the llm-d Router reads them; the x-slo-* names are older aliases.
SLO_TTFT_HEADERS = ("x-llm-d-slo-ttft-ms", "x-slo-ttft-ms")
SLO_TPOT_HEADERS = ("x-llm-d-slo-tpot-ms", "x-slo-tpot-ms")


def slo_targets(headers: Mapping[str, str]) -> tuple[float | None, float | None]:
    """(TTFT, TPOT) objectives in milliseconds from the SLO headers (the first name
    present wins), None where absent; a value that is not a positive number is a 400."""
    return _slo(headers, SLO_TTFT_HEADERS), _slo(headers, SLO_TPOT_HEADERS)


def _slo(headers: Mapping[str, str], names: tuple[str, ...]) -> float | None:
    for name in names:
        raw = headers.get(name)
        if raw is None:
            continue
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value > 0):
            raise BadRequestError(
                f"header {name}: expected a positive number of milliseconds, got {raw!r}",
                code="invalid_slo_header",
            )
        return value
    return None


def parse_prompt(doc: Mapping[str, Any]) -> tuple[str, int | None]:
    """The prompt as one string, and its tokens when known exactly (None: to be
    estimated from the string's length): completions' ``prompt`` (strings joined, or
    token ids as :func:`token_id_prompt` reads them), or chat ``messages`` as ``role:
    content`` lines (roles are part of what a server caches)."""
    prompt = doc.get("prompt")
    if prompt is not None:
        ids = token_id_prompt(prompt)
        return (_text(prompt), None) if ids is None else ids
    messages = doc.get("messages")
    if isinstance(messages, list):
        text = "".join(
            f"{m.get('role', '')}: {_text(m.get('content'))}\n"
            for m in messages
            if isinstance(m, dict)
        )
        return text, None
    return "", None


# characters a token id is spelled in, in a prompt's text (what the prefix index hashes:
# its blocks, sized for 4 characters a token, then hold whole ids)
TOKEN_ID_CHARS = CHARS_PER_TOKEN


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
    return "".join(_id_text(ids) for ids in batch), count


def _id_text(ids: list[int]) -> str:
    return "".join([f"{i % 10000:04d}" for i in ids])


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = []
        for item in value:
            if isinstance(item, int):
                parts.append(_id_text([item]))
            elif isinstance(item, dict):  # chat content parts
                parts.append(_text(item.get("text")))
            else:
                parts.append(_text(item))
        return "".join(parts)
    return ""


def _max_tokens(doc: Mapping[str, Any]) -> int | None:
    for key in ("max_completion_tokens", "max_tokens"):
        value = doc.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _json_kind(value: Any) -> str:
    return {
        dict: "an object",
        list: "an array",
        str: "a string",
        bool: "a boolean",
        int: "a number",
        float: "a number",
        type(None): "null",
    }.get(type(value), type(value).__name__)
