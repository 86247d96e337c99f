"""What every request API module provides (pure): how its body is read, where its
response says what it used, and the shape its errors take."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from epp.common.usage import Usage, find_usage
from epp.errors import BadRequestError, ClientVisibleError


@dataclass(frozen=True, slots=True)
class Read:
    """What a request body says that routing uses."""

    # the prompt as one string: what the prefix index hashes and the token estimate
    # divides (empty: nothing to match, e.g. a request that generates nothing)
    prompt: str
    # its tokens when known exactly (token ids, counted), else None: estimated
    token_count: int | None
    stream: bool
    max_tokens: int | None


@dataclass(frozen=True, slots=True)
class Api:
    """One request API: its parser, its usage reader and its error shape. ``name`` is the
    llm-d Router's parser that reads the same API (docs/apis.md)."""

    name: str
    read: Callable[[Mapping[str, Any]], Read]
    # usage from the response's first bytes (``head``: only where ``needs_head``) and its
    # last TAIL_BYTES (``tail``); None when the response does not say
    usage: Callable[[bytes, bytes], Usage | None]
    # the JSON body of an error answered for a request on this API
    error_body: Callable[[ClientVisibleError], bytes]
    # False: a body without ``model`` is routed as asking for the one its server serves
    # (model ""): the engines' generate APIs
    model_required: bool = True
    needs_head: bool = False


def openai_usage(head: bytes, tail: bytes) -> Usage | None:
    return find_usage(tail)


def openai_error(error: ClientVisibleError) -> bytes:
    return error.body()


def json_kind(value: Any) -> str:
    """How a JSON value is named in an error message."""
    return {
        dict: "an object",
        list: "an array",
        str: "a string",
        bool: "a boolean",
        int: "a number",
        float: "a number",
        type(None): "null",
    }.get(type(value), type(value).__name__)


def stream_flag(doc: Mapping[str, Any]) -> bool:
    return doc.get("stream") is True


def positive_int(value: Any) -> int | None:
    """``value`` when it is a JSON integer above 0, else None (a limit left to the server)."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


def bad(message: str, code: str = "invalid_body") -> BadRequestError:
    return BadRequestError(message, code=code)


def json_text(value: Any) -> str:
    """``value`` as compact JSON text, for a prompt's tool definitions and calls; empty
    when it nests deeper than the encoder goes (a prompt's text need not hold it all)."""
    try:
        return orjson.dumps(value).decode()
    except orjson.JSONEncodeError:
        return ""
