import random

import orjson

from epp.common.usage import TAIL_BYTES, Tail, Usage, find_usage


def test_non_streaming_body() -> None:
    body = orjson.dumps(
        {"choices": [{"text": "x"}], "usage": {"prompt_tokens": 7, "completion_tokens": 3}}
    )
    assert find_usage(body) == Usage(7, 3)


def test_sse_stream_takes_the_last_usage_chunk() -> None:
    events = [
        b'data: {"choices":[{"text":"a"}],"usage":null}\n\n',
        b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2}}\n\n',
        b"data: [DONE]\n\n",
    ]
    tail = Tail()
    for e in events:
        tail.add(e)
    assert find_usage(tail.bytes()) == Usage(5, 2)


def test_absent_null_or_garbage_usage_is_none() -> None:
    assert find_usage(b'{"choices": []}') is None
    assert find_usage(b'data: {"usage":null}\n\n') is None
    assert find_usage(b'{"usage": {"prompt_tokens": "x", "completion_tokens": 1}}') is None
    assert find_usage(b'{"usage": {"prompt_tokens": 1, "compl') is None
    assert find_usage(b'"usage" nothing') is None


def test_tail_is_bounded_and_keeps_the_end() -> None:
    tail = Tail()
    for i in range(100):
        tail.add(bytes([65 + i % 26]) * 100)
    assert len(tail.bytes()) == TAIL_BYTES
    assert tail.bytes().endswith(bytes([65 + 99 % 26]) * 100)
    tail.add(b"x" * (TAIL_BYTES + 5))
    assert tail.bytes() == b"x" * TAIL_BYTES


def test_the_tail_is_the_bodys_last_bytes_at_every_step() -> None:
    rng = random.Random(7)
    for _ in range(50):
        kept, body = Tail(), b""
        assert kept.bytes() == b""
        for i in range(rng.randrange(1, 60)):
            size = rng.choice([0, 1, 7, 100, 900, TAIL_BYTES - 1, TAIL_BYTES, 3 * TAIL_BYTES])
            chunk = bytes([i % 256]) * size + rng.randbytes(rng.randrange(0, 3))
            kept.add(chunk)
            body += chunk
            assert kept.bytes() == body[-TAIL_BYTES:]
