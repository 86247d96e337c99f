"""Turn a request's headers and raw body into an :class:`InferenceRequest` (pure).

The body is parsed exactly once, here, by its path's API (:mod:`epp.common.apis`).
Anything wrong with it raises a :class:`BadRequestError` whose message says precisely
what.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import orjson

from epp.common.apis import Api, api_for
from epp.common.apis.base import json_kind
from epp.common.apis.openai import TOKEN_ID_CHARS, parse_prompt, token_id_prompt
from epp.errors import BadRequestError
from epp.types import CHARS_PER_TOKEN, InferenceRequest

# where they were first defined: tests and benchmarks import them from here
__all__ = ["TOKEN_ID_CHARS", "parse_prompt", "parse_request", "slo_targets", "token_id_prompt"]


def parse_request(
    request_id: str,
    headers: Mapping[str, str],
    body: bytes | None,
    subset: frozenset[str] | None = None,
    chars_per_token: float = CHARS_PER_TOKEN,
    api: Api | None = None,
) -> tuple[InferenceRequest, dict[str, Any] | None]:
    """Parse a request by its path's API (``api``: already looked up by the caller);
    returns it with the decoded JSON body (None when the request has no body, e.g.
    ``GET /v1/models``). ``chars_per_token``: what its prompt's token estimate divides
    by (the ratio learned so far)."""
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
            f"request body must be a JSON object, got {json_kind(doc)}", code="invalid_body"
        )
    slo_ttft, slo_tpot = slo_targets(headers)
    if api is None:
        api = api_for(path)
    model = doc.get("model")
    if model is None:
        if api.model_required:
            raise BadRequestError("request body has no 'model' field", code="missing_model")
        model = ""  # the one the server serves: an inference request all the same
    elif not isinstance(model, str) or not model:
        raise BadRequestError(
            f"'model' must be a non-empty string, got {json_kind(model)}", code="invalid_model"
        )
    read = api.read(doc)
    if read.token_count is not None:  # its text spells each id in TOKEN_ID_CHARS characters
        chars_per_token = TOKEN_ID_CHARS
    return (
        InferenceRequest(
            request_id=request_id,
            model=model,
            path=path,
            prompt=read.prompt,
            stream=read.stream,
            max_tokens=read.max_tokens,
            headers=headers,
            subset=subset,
            slo_ttft_ms=slo_ttft,
            slo_tpot_ms=slo_tpot,
            body=doc,
            chars_per_token=chars_per_token,
            prompt_token_count=read.token_count,
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
