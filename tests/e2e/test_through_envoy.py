"""End to end: the official openai client -> real Envoy -> real EPP -> real simulators."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import orjson
import pytest

from epp_harness.envoyconfig import EnvoyOptions, epp_config
from epp_harness.envoyproc import EnvoyProcess, write_config
from epp_harness.stack import LocalStack
from tests.e2e.conftest import MAX_BODY, ephemeral, transport_stack
from tests.support.http import epp_in_flight, get_json, metric_samples, open_raw_post, request
from tests.support.transports import transports
from tests.support.wait import quiesce, wait_for

pytestmark = pytest.mark.e2e
MODEL = "sim-model"


@pytest.fixture(scope="module", params=transports(every=True))
def stack(request: pytest.FixtureRequest) -> Iterator[LocalStack]:
    """The request path through a real Envoy is what `make test` checks on every
    transport, the opt-in ones included."""
    yield from transport_stack(request.param)


def client(stack: LocalStack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.envoy_url}/v1", api_key="unused", max_retries=0)


def test_completion_and_chat(stack: LocalStack) -> None:
    c = client(stack)
    completion = c.completions.create(model=MODEL, prompt="Hello there", max_tokens=5)
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage is not None and completion.usage.completion_tokens == 5
    chat = c.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4
    )
    assert chat.choices[0].message.content
    assert chat.usage is not None and chat.usage.completion_tokens == 4


def test_streaming_completion_and_chat(stack: LocalStack) -> None:
    c = client(stack)
    chunks = list(
        c.completions.create(
            model=MODEL,
            prompt="Stream me",
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
    assert len(text) > 0
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6
    chat_chunks = list(
        c.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=3, stream=True
        )
    )
    deltas = [ch.choices[0].delta.content or "" for ch in chat_chunks if ch.choices]
    assert "".join(deltas)
    assert chat_chunks[-1].choices[0].finish_reason == "length"


def test_models_get_without_body_is_routed(stack: LocalStack) -> None:
    models = client(stack).models.list()
    assert [m.id for m in models.data] == [MODEL]


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b"{not json", 400, "invalid_json"),
        (b"[1]", 400, "invalid_body"),
        (b'{"prompt": "no model"}', 400, "missing_model"),
        (b'{"model": 42, "prompt": "x"}', 400, "invalid_model"),
    ],
)
def test_bad_requests_get_precise_json_errors(
    stack: LocalStack, body: bytes, status: int, code: str
) -> None:
    got, headers, raw = request(f"{stack.envoy_url}/v1/completions", body)
    assert got == status
    assert headers["content-type"] == "application/json"
    error = json.loads(raw)["error"]
    assert error["code"] == code and error["type"] == "invalid_request_error"
    assert error["message"]


def test_body_over_limit_is_413_and_others_unaffected(stack: LocalStack) -> None:
    big = orjson.dumps({"model": MODEL, "prompt": "x" * (MAX_BODY + 10), "max_tokens": 1})
    status, headers, raw = request(f"{stack.envoy_url}/v1/completions", big)
    assert status == 413
    assert headers["content-type"] == "application/json"
    assert str(MAX_BODY) in json.loads(raw)["error"]["message"]
    ok = client(stack).completions.create(model=MODEL, prompt="still fine", max_tokens=1)
    assert ok.choices


def test_one_mib_body_arrives_byte_exact(stack: LocalStack) -> None:
    prompt = "".join(chr(0x61 + i % 26) for i in range(1024 * 1024))
    body = orjson.dumps({"model": MODEL, "prompt": prompt, "max_tokens": 1})
    status, headers, _ = request(f"{stack.envoy_url}/v1/completions", body)
    assert status == 200
    served = headers["x-sim-instance"]
    last = get_json(f"http://{served}/sim/last-request")
    assert last["body_bytes"] == len(body)
    assert last["body_sha256"] == hashlib.sha256(body).hexdigest()


def test_client_routing_headers_are_not_trusted(stack: LocalStack) -> None:
    body = orjson.dumps({"model": MODEL, "prompt": "x", "max_tokens": 1})
    status, headers, _ = request(
        f"{stack.envoy_url}/v1/completions",
        body,
        headers={"x-gateway-destination-endpoint": "10.255.255.1:1", "x-prefiller-host-port": "x"},
    )
    assert status == 200
    served = headers["x-sim-instance"]
    assert served in stack.sim_addresses
    seen = get_json(f"http://{served}/sim/last-request")["headers"]
    # the EPP's ordered list (the EDS config takes fallbacks), the server that answered first
    destinations = seen["x-gateway-destination-endpoint"].split(",")
    assert destinations[0] == served and len(destinations) == 3
    assert "x-prefiller-host-port" not in seen
    assert seen["x-request-id"]  # Envoy or the EPP always sets one


def test_concurrent_requests_spread_across_servers(stack: LocalStack) -> None:
    def one(i: int) -> str:
        # distinct prompts: no prefix affinity, so load alone decides
        body = orjson.dumps({"model": MODEL, "prompt": f"{i} spread " * 20, "max_tokens": 12})
        status, headers, _ = request(f"{stack.envoy_url}/v1/completions", body)
        assert status == 200
        return headers["x-sim-instance"]

    with ThreadPoolExecutor(16) as pool:
        served = list(pool.map(one, range(32)))
    counts = {a: served.count(a) for a in stack.sim_addresses}
    assert all(n >= 4 for n in counts.values()), counts


def test_in_flight_held_while_streaming_and_released_on_disconnect(stack: LocalStack) -> None:
    body = orjson.dumps(
        {"model": MODEL, "prompt": "long stream", "max_tokens": 2000, "stream": True}
    )
    quiesce(stack)  # earlier tests' requests all released
    socks = []
    for _ in range(3):
        s = open_raw_post(stack.envoy_url, "/v1/completions", body)
        assert b"200 OK" in s.recv(4096)  # the stream has started
        socks.append(s)
    assert epp_in_flight(stack.epp_http_url) == 3
    for s in socks:
        s.close()  # client walks away mid-stream
    wait_for(lambda: epp_in_flight(stack.epp_http_url) == 0, what="in-flight back to zero")


def stream_ends(stack: LocalStack) -> dict[str, float]:
    """epp_extproc_streams_total by its ``end`` label, once every stream open has ended
    (each is counted as Envoy closes it, which can be after its client had the answer)."""
    quiesce(stack)
    samples = metric_samples(f"{stack.epp_http_url}/metrics", "epp_extproc_streams_total{")
    return {label.split('"')[1]: value for label, value in samples.items()}


def transport(stack: LocalStack) -> str:
    args = stack.opts.epp_args
    return args[args.index("--transport") + 1]


def test_envoy_half_closes_every_ext_proc_stream(stack: LocalStack) -> None:
    """Envoy's graceful close (our configs turn it on): a request's stream ends with a
    half-close, also when the client walks away mid-response, not with the RST_STREAM
    that left an exception (and, under grpclib, garbage cycles) behind per request.
    grpc.aio shows a half-close and a reset alike (``ended``): there only grpclib's and
    the native transport's answers tell them apart."""
    before = stream_ends(stack)
    body = orjson.dumps({"model": MODEL, "prompt": "hello", "max_tokens": 3})
    for _ in range(5):
        assert request(f"{stack.envoy_url}/v1/completions", body)[0] == 200
    streaming = orjson.dumps(
        {"model": MODEL, "prompt": "long stream", "max_tokens": 2000, "stream": True}
    )
    with open_raw_post(stack.envoy_url, "/v1/completions", streaming) as s:
        assert b"200 OK" in s.recv(4096)  # then the client is gone
    clean = "ended" if transport(stack) == "grpcio" else "complete"
    after = stream_ends(stack)  # the client that walked away is counted as such
    ended = {end: n - before.get(end, 0) for end, n in after.items() if n != before.get(end, 0)}
    assert ended == {clean: 5, "abandoned": 1}


def test_an_envoy_without_graceful_close_resets_every_stream(
    stack: LocalStack, tmp_path: Path
) -> None:
    """What a gateway's Envoy without the runtime flag does: every stream reset, which
    the metric tells apart on grpclib and native (``cancelled``)."""
    if transport(stack) == "grpcio":
        pytest.skip("grpc.aio ends the request iterator alike for a reset and a half-close")
    opts = EnvoyOptions(listen_port=0, admin_port=0, epp_port=stack.grpc_port, graceful_close=False)
    envoy = EnvoyProcess(write_config(epp_config(opts), tmp_path / "envoy.yaml"), tmp_path)
    envoy.start()
    try:
        before = stream_ends(stack)
        body = orjson.dumps({"model": MODEL, "prompt": "hello", "max_tokens": 3})
        for _ in range(5):
            status, _, reply = request(f"http://127.0.0.1:{envoy.port}/v1/completions", body)
            assert status == 200, reply
        # while this Envoy still runs (stream_ends waits for every stream to end): reset
        # as each request ended
        after = stream_ends(stack)
        assert after.get("cancelled", 0) - before.get("cancelled", 0) == 5
        assert after.get("complete", 0) == before.get("complete", 0)
    finally:
        envoy.stop()


def test_no_endpoint_is_503() -> None:
    with LocalStack(ephemeral(servers=0)) as empty:
        status, headers, raw = request(
            f"{empty.envoy_url}/v1/completions", b'{"model": "m", "prompt": "x"}'
        )
    assert status == 503
    assert headers["content-type"] == "application/json"
    assert headers["x-llm-d-request-dropped-reason"] == "rejected-no-endpoints"
    assert json.loads(raw)["error"]["code"] == "no_endpoint"
