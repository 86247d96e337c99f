"""Every request API through a real Envoy, the EPP and simulators: Anthropic Messages
with the official ``anthropic`` client (streamed and not, count_tokens, prefix affinity
on a shared system prompt, usage counted), bad bodies answered in Anthropic's error
shape, vLLM's and SGLang's generate (token-id prefixes sticking, bad ids refused),
Responses and embeddings routed and counted, an unknown path passed through; every
request's in-flight count back to zero."""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import orjson
import pytest

from epp_harness.stack import LocalStack
from tests.e2e.conftest import MAX_BODY, ephemeral
from tests.support.http import metric_sum, request
from tests.support.wait import quiesce

pytestmark = pytest.mark.e2e
MODEL = "sim-model"
INSTANCE = "x-sim-instance"


@pytest.fixture(scope="module")
def four() -> Iterator[LocalStack]:
    opts = ephemeral(
        servers=4,
        sim_args=["--time-scale", "0.1", "--enable-prompt-tokens-details"],
        epp_args=["--max-body-bytes", str(MAX_BODY)],
    )
    with LocalStack(opts) as s:
        yield s


def client(stack: LocalStack) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=stack.envoy_url, api_key="unused", max_retries=0)


def tokens(stack: LocalStack) -> dict[str, float]:
    """The EPP's counts of prompt and completion tokens read from usage, once idle."""
    quiesce(stack)
    text = request(f"{stack.epp_http_url}/metrics")[2].decode()
    return {
        kind: metric_sum("\n".join(ln for ln in text.splitlines() if f'kind="{kind}"' in ln),
                         "epp_tokens_total")
        for kind in ("prompt", "completion")
    }  # fmt: skip


def test_messages_share_a_server_by_system_prompt_and_are_counted(four: LocalStack) -> None:
    c = client(four)
    before = tokens(four)
    systems = {g: f"You are agent {g}. " + f"Rules of team {g} and more. " * 100 for g in "ABC"}
    served: dict[str, set[str]] = {g: set() for g in systems}
    prompt = completion = 0
    for i in range(6):
        for g, system in systems.items():
            turns = [{"role": "user", "content": [{"type": "text", "text": f"Task {i}?"}]}]
            if i % 2:
                with c.messages.stream(
                    model=MODEL, system=system, max_tokens=4, messages=turns
                ) as stream:
                    assert "".join(stream.text_stream)
                    message = stream.get_final_message()
                    served[g].add(stream.response.headers[INSTANCE])
            else:
                raw = c.messages.with_raw_response.create(
                    model=MODEL, system=system, max_tokens=4, messages=turns
                )
                message = raw.parse()
                served[g].add(raw.headers[INSTANCE])
            assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 4
            usage = message.usage
            prompt += usage.input_tokens + (usage.cache_read_input_tokens or 0)
            completion += usage.output_tokens
    assert all(len(s) == 1 for s in served.values()), served
    # what the EPP read from the responses (streamed: message_start and message_delta)
    after = tokens(four)
    assert after["prompt"] - before["prompt"] == prompt
    assert after["completion"] - before["completion"] == completion


def test_count_tokens_answers_the_prompts_tokens(four: LocalStack) -> None:
    c = client(four)
    turns = [{"role": "user", "content": "How many tokens is this?"}]
    counted = c.messages.count_tokens(model=MODEL, system="Be brief.", messages=turns)
    message = c.messages.create(model=MODEL, system="Be brief.", max_tokens=2, messages=turns)
    usage = message.usage
    assert counted.input_tokens == usage.input_tokens + (usage.cache_read_input_tokens or 0)


DEEP = b'{"model": "sim-model", "max_tokens": 1, "x": ' + b"[" * 2000 + b"]" * 2000 + b"}"


@pytest.mark.parametrize(
    ("body", "status", "kind", "fragment"),
    [
        (b"{not json", 400, "invalid_request_error", "not valid JSON"),
        (b'{"model": "sim-\xff"}', 400, "invalid_request_error", "UTF-8"),
        (DEEP, 400, "invalid_request_error", "depth"),
        (b'{"model": "sim-model", "messages": [{"role": "user", "content": "x"}]}', 400,
         "invalid_request_error", "max_tokens"),
        (b'{"model": "sim-model", "max_tokens": 1, "messages": "x"}', 400,
         "invalid_request_error", "messages"),
        (b'{"model": 5, "max_tokens": 1, "messages": []}', 400, "invalid_request_error", "model"),
        (orjson.dumps({"model": MODEL, "max_tokens": 1, "system": "x" * (MAX_BODY + 1),
                       "messages": [{"role": "user", "content": "x"}]}),
         413, "request_too_large", str(MAX_BODY)),
    ],
)  # fmt: skip
@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens"])
def test_bad_messages_get_anthropics_error_shape(
    four: LocalStack, path: str, body: bytes, status: int, kind: str, fragment: str
) -> None:
    got, headers, raw = request(f"{four.envoy_url}{path}", body)
    if fragment == "max_tokens" and path.endswith("count_tokens"):
        assert got == 200  # count_tokens generates nothing: it takes no max_tokens
        return
    assert got == status and headers["content-type"] == "application/json"
    doc = orjson.loads(raw)
    assert doc["type"] == "error" and doc["error"]["type"] == kind
    assert fragment in doc["error"]["message"]
    quiesce(four)  # nothing left in flight


def test_the_client_sees_a_refusal_as_its_own_error_class(four: LocalStack) -> None:
    with pytest.raises(anthropic.BadRequestError) as info:
        client(four).messages.create(model=MODEL, max_tokens=0, messages=[])
    assert info.value.status_code == 400
    assert info.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]


def post(
    stack: LocalStack, path: str, doc: dict[str, object]
) -> tuple[int, str, dict[str, object]]:
    status, headers, raw = request(f"{stack.envoy_url}{path}", orjson.dumps(doc))
    body = orjson.loads(raw) if raw.startswith(b"{") else {"raw": raw}
    return status, headers.get(INSTANCE, ""), body


@pytest.mark.parametrize(
    ("path", "field", "limits"),
    [
        ("/inference/v1/generate", "token_ids", {"sampling_params": {"max_tokens": 3}}),
        ("/generate", "input_ids", {"sampling_params": {"max_new_tokens": 3}}),
    ],
)
def test_generate_routes_token_id_prefixes_and_refuses_bad_ids(
    four: LocalStack, path: str, field: str, limits: dict[str, object]
) -> None:
    before = tokens(four)
    groups = {g: [1000 * (g + 1) + i % 500 for i in range(2000)] for g in range(3)}
    served: dict[int, set[str]] = {g: set() for g in groups}
    prompt = 0
    for i in range(4):
        for g, ids in groups.items():
            doc = {field: [*ids, i], "stream": i % 2 == 1, **limits}
            if path == "/inference/v1/generate" and i % 2:
                doc["stream_options"] = {"include_usage": True}
            status, instance, _ = post(four, path, doc)
            assert status == 200
            served[g].add(instance)
            prompt += len(ids) + 1
    assert all(len(s) == 1 for s in served.values()), served
    after = tokens(four)
    assert after["prompt"] - before["prompt"] == prompt
    assert after["completion"] - before["completion"] == 3 * 12
    for bad in ([1, -1], [1, 2.5], [], "12"):
        status, _, body = post(four, path, {field: bad})
        assert status == 400
        error = body["error"]
        assert isinstance(error, dict) and error["code"] == "invalid_token_ids"
    quiesce(four)


def test_responses_and_embeddings_are_routed_and_counted(four: LocalStack) -> None:
    before = tokens(four)
    doc = {"model": MODEL, "instructions": "Be brief.", "input": "Hi", "max_output_tokens": 5}
    status, _, body = post(four, "/v1/responses", doc)
    assert status == 200 and body["object"] == "response"
    usage = body["usage"]
    assert isinstance(usage, dict) and usage["output_tokens"] == 5
    status, _, embedded = post(four, "/v1/embeddings", {"model": MODEL, "input": "abcd" * 10})
    assert status == 200 and embedded["usage"] == {"prompt_tokens": 10, "total_tokens": 10}
    after = tokens(four)
    assert after["prompt"] - before["prompt"] == usage["input_tokens"] + 10
    assert after["completion"] - before["completion"] == 5
    status, _, body = post(four, "/v1/embeddings", {"input": "no model"})
    assert status == 400 and body["error"]["code"] == "missing_model"  # type: ignore[index]


def test_an_unknown_path_is_routed_as_sent(four: LocalStack) -> None:
    status, instance, _ = post(four, "/v1/unknown", {"model": MODEL, "anything": 1})
    assert status == 404 and instance in four.sim_addresses  # the server's own answer
    quiesce(four)
