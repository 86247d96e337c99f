"""The engines' own generate APIs (pure): vLLM's ``/inference/v1/generate`` (token ids
in, the disaggregated-serving API) and SGLang's ``/generate`` (token ids or text).

Token ids are the prompt: checked (non-negative integers, else a 400), counted exactly
and spelled for the prefix index as completions' token-id prompts are
(:func:`epp.common.apis.openai.token_id_prompt`). Neither API needs ``model``: a server
serves one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from epp.common.apis.base import (
    Api,
    Read,
    bad,
    json_kind,
    openai_error,
    openai_usage,
    positive_int,
    stream_flag,
)
from epp.common.apis.openai import id_text
from epp.common.usage import Usage, cached_within, last_object

VLLM_GENERATE = "/inference/v1/generate"
SGLANG_GENERATE = "/generate"
# token ids are unsigned 32-bit integers (the llm-d Router reads them so)
MAX_TOKEN_ID = 2**32 - 1
_INT = frozenset({int})


def token_ids(value: Any, name: str, batch: bool = False) -> tuple[str, int]:
    """A prompt of token ids (with ``batch``, also a list of such lists) as (text,
    count); a BadRequestError saying what is wrong when it is not one."""
    expected = "a non-empty array of token ids" + (" (or of such arrays)" if batch else "")
    if not isinstance(value, list) or not value:
        raise bad(f"'{name}' must be {expected}, got {json_kind(value)}", "invalid_token_ids")
    lists = value if batch and isinstance(value[0], list) else [value]
    count = 0
    for ids in lists:
        # one pass each in C: a prompt may hold many thousands of ids
        if (
            not isinstance(ids, list)
            or not ids
            or not set(map(type, ids)) <= _INT
            or min(ids) < 0
            or max(ids) > MAX_TOKEN_ID
        ):
            raise bad(
                f"'{name}' must be {expected}: integers from 0 to {MAX_TOKEN_ID}",
                "invalid_token_ids",
            )
        count += len(ids)
    return "".join(id_text(ids) for ids in lists), count


def _sampling(doc: Mapping[str, Any]) -> Mapping[str, Any]:
    params = doc.get("sampling_params")
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise bad(f"'sampling_params' must be an object, got {json_kind(params)}")
    return params


def _read_vllm(doc: Mapping[str, Any]) -> Read:
    """``token_ids`` (required), ``sampling_params.max_tokens``, ``stream``."""
    prompt, count = token_ids(doc.get("token_ids"), "token_ids")
    limit = positive_int(_sampling(doc).get("max_tokens"))
    return Read(prompt, count, stream_flag(doc), limit)


def _read_sglang(doc: Mapping[str, Any]) -> Read:
    """``input_ids`` (one prompt or a batch), else ``text`` (a string or a batch of
    them); ``sampling_params.max_new_tokens``, ``stream``."""
    limit = positive_int(_sampling(doc).get("max_new_tokens"))
    if doc.get("input_ids") is not None:
        prompt, count = token_ids(doc["input_ids"], "input_ids", batch=True)
        return Read(prompt, count, stream_flag(doc), limit)
    text = doc.get("text")
    if isinstance(text, list) and text and all(isinstance(t, str) for t in text):
        text = "".join(text)
    if not isinstance(text, str) or not text:
        raise bad(
            "give 'input_ids' (token ids) or 'text' (a non-empty string or array of them)",
            "missing_prompt",
        )
    return Read(text, None, stream_flag(doc), limit)


def _sglang_usage(head: bytes, tail: bytes) -> Usage | None:
    """SGLang's counts live in the last ``meta_info``: ``prompt_tokens``,
    ``completion_tokens``, ``cached_tokens``."""
    obj = last_object(tail, b'"meta_info"')
    if obj is None:
        return None
    prompt, completion = obj.get("prompt_tokens"), obj.get("completion_tokens")
    if not isinstance(prompt, int) or not isinstance(completion, int):
        return None
    return Usage(prompt, completion, cached_within(obj.get("cached_tokens"), prompt))


VLLM = Api("vllmhttp-parser", _read_vllm, openai_usage, openai_error, model_required=False)
SGLANG = Api("sglanghttp-parser", _read_sglang, _sglang_usage, openai_error, model_required=False)
