"""Token-id prompts through Envoy and the EPP to a simulator whose tokenizer is a
character a token (a byte tokenizer): text prompts teach the EPP that ratio, and
token-id prompts (spelled 4 characters an id in the EPP's prompt text) leave it alone."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from epp_harness.stack import LocalStack
from tests.e2e.conftest import ephemeral
from tests.support.http import metric_sum, request
from tests.support.wait import wait_for

pytestmark = pytest.mark.e2e


def ratio_and_prompt_tokens(stack: LocalStack) -> tuple[float, float]:
    text = request(f"{stack.epp_http_url}/metrics")[2].decode()
    prompt = "\n".join(ln for ln in text.splitlines() if 'kind="prompt"' in ln)
    return metric_sum(text, "epp_prompt_chars_per_token"), metric_sum(prompt, "epp_tokens_total")


def complete(stack: LocalStack, prompt: object) -> int:
    """The prompt tokens the server reported."""
    body = orjson.dumps({"model": "sim-model", "prompt": prompt, "max_tokens": 1})
    status, _, raw = request(f"{stack.envoy_url}/v1/completions", body)
    assert status == 200, raw
    tokens: int = orjson.loads(raw)["usage"]["prompt_tokens"]
    return tokens


def settled(stack: LocalStack, served: int) -> float:
    """The learned ratio once the EPP has seen the usage of all ``served`` tokens."""
    return wait_for(
        lambda: (r := ratio_and_prompt_tokens(stack))[1] == served and r[0],
        what=f"the EPP to count {served} prompt tokens",
    )


def test_token_id_prompts_do_not_pull_the_learned_ratio(tmp_path: Path) -> None:
    opts = ephemeral(servers=1, kv_events=True, sim_args=["--time-scale", "0"], workdir=tmp_path)
    with LocalStack(opts) as stack:
        served = sum(complete(stack, f"question {i}: " + "x" * 500) for i in range(10))
        learned = settled(stack, served)
        assert learned < 2.5  # a character a token, the prior (4) fading
        ids = list(range(100, 2100))
        served += sum(complete(stack, prompt) for prompt in (ids, ids, [ids[:500], ids[:500]]))
        assert settled(stack, served) == learned
