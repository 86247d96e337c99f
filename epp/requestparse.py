"""Turn a request's headers and raw body into an :class:`InferenceRequest` (pure).

The body is parsed exactly once, here. Anything wrong with it raises a
:class:`BadRequestError` whose message says precisely what.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from epp.errors import BadRequestError
from epp.types import InferenceRequest


def parse_request(
    request_id: str, headers: Mapping[str, str], body: bytes | None
) -> tuple[InferenceRequest, dict[str, Any] | None]:
    """Parse an OpenAI-style request; returns it with the decoded JSON body (None when
    the request has no body, e.g. ``GET /v1/models``)."""
    path = headers.get(":path", "/").split("?", 1)[0]
    if body is None:
        return InferenceRequest(request_id=request_id, model=None, path=path, headers=headers), None
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
    model = doc.get("model")
    if model is None:
        raise BadRequestError("request body has no 'model' field", code="missing_model")
    if not isinstance(model, str) or not model:
        raise BadRequestError(
            f"'model' must be a non-empty string, got {_json_kind(model)}", code="invalid_model"
        )
    return (
        InferenceRequest(
            request_id=request_id,
            model=model,
            path=path,
            prompt_chars=prompt_chars(doc),
            stream=doc.get("stream") is True,
            headers=headers,
        ),
        doc,
    )


def prompt_chars(doc: Mapping[str, Any]) -> int:
    """Characters of prompt text (tokens are estimated as chars / 4 downstream)."""
    prompt = doc.get("prompt")
    if prompt is not None:
        return _text_len(prompt)
    messages = doc.get("messages")
    if isinstance(messages, list):
        return sum(_text_len(m.get("content")) for m in messages if isinstance(m, dict))
    return 0


def _text_len(value: Any) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list):
        total = 0
        for item in value:
            if isinstance(item, int):  # token ids: one token ~ 4 chars
                total += 4
            elif isinstance(item, dict):  # chat content parts
                total += _text_len(item.get("text"))
            else:
                total += _text_len(item)
        return total
    return 0


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
