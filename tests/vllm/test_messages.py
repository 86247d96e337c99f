"""Anthropic Messages on a real vLLM server behind Envoy and the EPP: the official
``anthropic`` client, streamed and not, count_tokens, the usage the EPP reads from
vLLM's Messages responses, and a malformed body refused in Anthropic's error shape."""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import orjson
import pytest

from epp_harness.stack import LocalStack
from tests.support.http import metric_sum, request
from tests.support.wait import quiesce
from tests.vllm.conftest import epp_stack
from tests.vllm.servers import MODEL_NAME, vllm_servers

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    workdir = tmp_path_factory.mktemp("vllm-messages")
    with (
        vllm_servers(workdir, [("vllm-messages", [], {})]) as (server,),
        epp_stack(workdir / "epp", ["--endpoint", server.address]) as s,
    ):
        yield s


def counted(stack: LocalStack) -> tuple[float, float]:
    """The prompt and completion tokens the EPP read from usage, once idle."""
    quiesce(stack)
    text = request(f"{stack.epp_http_url}/metrics")[2].decode()
    kinds = [
        "\n".join(ln for ln in text.splitlines() if f'kind="{kind}"' in ln)
        for kind in ("prompt", "completion")
    ]
    return metric_sum(kinds[0], "epp_tokens_total"), metric_sum(kinds[1], "epp_tokens_total")


def test_messages_through_envoy_and_the_epp(stack: LocalStack) -> None:
    client = anthropic.Anthropic(base_url=stack.envoy_url, api_key="unused", max_retries=0)
    system = "You answer questions about caches. " * 20
    turns = [{"role": "user", "content": "What is a prefix cache?"}]
    prompt0, completion0 = counted(stack)
    message = client.messages.create(model=MODEL_NAME, system=system, max_tokens=4, messages=turns)
    assert message.role == "assistant" and message.usage.output_tokens >= 1
    with client.messages.stream(
        model=MODEL_NAME, system=system, max_tokens=4, messages=turns
    ) as stream:
        "".join(stream.text_stream)
        streamed = stream.get_final_message()
    usages = [message.usage, streamed.usage]
    # vLLM reports apart the prompt tokens read from its prefix cache and those it
    # newly cached (the full blocks): input_tokens is the rest, as Anthropic counts
    prompts = [
        u.input_tokens + (u.cache_read_input_tokens or 0) + (u.cache_creation_input_tokens or 0)
        for u in usages
    ]
    assert prompts[0] == prompts[1]
    assert streamed.usage.cache_read_input_tokens  # the first request's blocks
    tokens = client.messages.count_tokens(model=MODEL_NAME, system=system, messages=turns)
    assert tokens.input_tokens == prompts[0]
    prompt1, completion1 = counted(stack)
    assert prompt1 - prompt0 == sum(prompts)
    assert completion1 - completion0 == sum(u.output_tokens for u in usages)


def test_a_malformed_body_gets_anthropics_error_shape(stack: LocalStack) -> None:
    body = orjson.dumps({"model": MODEL_NAME, "messages": [{"role": "user", "content": "x"}]})
    status, _, raw = request(f"{stack.envoy_url}/v1/messages", body)
    doc = orjson.loads(raw)
    assert status == 400 and doc["type"] == "error"
    assert (
        doc["error"]["type"] == "invalid_request_error" and "max_tokens" in doc["error"]["message"]
    )
