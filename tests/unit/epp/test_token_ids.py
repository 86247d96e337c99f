"""Prompts of token ids (completions' ``prompt`` as a list of integers, or a batch of
such lists): their tokens are counted, never estimated from characters, and their
completions teach the learned characters per token nothing."""

from __future__ import annotations

import orjson
import pytest

from epp.common.requestparse import parse_request, token_id_prompt
from epp.common.usage import Usage
from epp.config import build_scheduler
from epp.datastore import Datastore
from epp.observability.metrics import EppMetrics
from epp.router import Router, StreamOptions
from epp.types import Endpoint
from tests.support.routers import make_router

HEADERS = {":path": "/v1/completions", ":method": "POST"}
IDS = list(range(1000, 6000))  # 5,000 ids
TEXT = "x" * 1000


def body(prompt: object) -> bytes:
    return orjson.dumps({"model": "m", "prompt": prompt, "max_tokens": 1})


@pytest.mark.parametrize("ratio", [0.25, 1.0, 3.0, 4.0, 16.0])
@pytest.mark.parametrize(
    ("prompt", "count"),
    [(IDS, 5000), ([IDS[:7], IDS[:3]], 10), ([5], 1), ([[1, 2], []], 2)],
)
def test_a_token_id_prompt_counts_its_ids_under_any_learned_ratio(
    ratio: float, prompt: object, count: int
) -> None:
    request, _ = parse_request("r", HEADERS, body(prompt), chars_per_token=ratio)
    assert request.prompt_tokens == count
    assert request.prompt_token_count == count


@pytest.mark.parametrize("prompt", ["text", ["ab", "cd"], [1, "a"], [[1, 2], "a"], [[1, 2.5]], []])
def test_other_prompts_are_estimated_from_their_characters(prompt: object) -> None:
    request, _ = parse_request("r", HEADERS, body(prompt), chars_per_token=1.0)
    assert request.prompt_token_count is None
    assert request.prompt_tokens == max(1, len(request.prompt))


def test_chat_prompts_are_estimated() -> None:
    chat = {"model": "m", "messages": [{"role": "user", "content": "x" * 40}]}
    request, _ = parse_request("r", HEADERS, orjson.dumps(chat), chars_per_token=2.0)
    assert request.prompt_token_count is None
    assert request.prompt_tokens == 24  # 47 characters ("user: " and a newline), 2 a token


def test_token_ids_spell_four_characters_each_for_the_prefix_index() -> None:
    assert token_id_prompt([1, 2, 30000]) == ("000100020000", 3)
    assert token_id_prompt([[1], [2, 3]]) == ("000100020003", 3)
    assert token_id_prompt(["a"]) is None
    assert token_id_prompt("abc") is None
    # the prefix index's characters convert to these tokens at 4 a token, whatever the
    # learned ratio: one of its 64-character blocks holds 16 ids
    request, _ = parse_request("r", HEADERS, body(IDS), chars_per_token=1.0)
    assert request.chars_per_token == 4.0


def router() -> Router:
    datastore = Datastore()
    datastore.add(Endpoint("10.0.0.1", 8000))
    metrics = EppMetrics(datastore)
    return make_router(datastore, build_scheduler(""), metrics, stream=StreamOptions(1 << 24))


def complete(r: Router, prompt: object, prompt_tokens: int) -> None:
    request, _ = parse_request("r", HEADERS, body(prompt), chars_per_token=r.chars_per_token)
    routed = r.route(request)
    r.completed(routed, 200, "", Usage(prompt_tokens, 1))
    routed.release()


def test_a_token_id_completion_leaves_the_learned_ratio_alone() -> None:
    r = router()
    for _ in range(20):  # a tokenizer of about a character a token
        complete(r, TEXT, 1000)
    learned = r.chars_per_token
    assert learned < 1.5
    complete(r, IDS, len(IDS))
    complete(r, [IDS, IDS], 2 * len(IDS))
    assert r.chars_per_token == learned
    # and a token-id prompt is still priced at its ids
    request, _ = parse_request("r", HEADERS, body(IDS), chars_per_token=r.chars_per_token)
    assert request.prompt_tokens == len(IDS)
