"""``epp sim --enable-prompt-tokens-details``: ``usage.prompt_tokens_details.cached_tokens``
in completions and chat responses, streaming (final usage chunk) and not, as vLLM."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.support.sim import SimProc, chat, completion, sims, sse_events

PROMPT = "k" * 1000  # 250 tokens: 15 full 16-token blocks = 240 cacheable tokens


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[SimProc]]:
    """One simulator reporting prompt token details, one with the default (off)."""
    workdir: Path = tmp_path_factory.mktemp("sim-cached")
    fast = ["--time-scale", "0"]
    with sims(workdir, [*fast, "--enable-prompt-tokens-details"], fast) as both:
        yield both


def usage_of(sim: SimProc, path: str, body: dict[str, Any]) -> dict[str, Any]:
    status, raw = sim.post(path, body)
    assert status == 200, raw
    if not body.get("stream"):
        usage: dict[str, Any] = orjson.loads(raw)["usage"]
        return usage
    events = sse_events(raw)
    assert events[-1] == "[DONE]" and events[-2]["choices"] == []
    final: dict[str, Any] = events[-2]["usage"]
    return final


CASES = [
    ("/v1/completions", completion, False),
    ("/v1/completions", completion, True),
    ("/v1/chat/completions", chat, False),
    ("/v1/chat/completions", chat, True),
]


@pytest.mark.parametrize(("path", "make", "stream"), CASES)
def test_cached_tokens_reported_when_enabled(
    pair: list[SimProc], path: str, make: Any, stream: bool
) -> None:
    on, off = pair
    prompt = f"{path}{stream}".ljust(40, "-") + PROMPT  # a prompt of its own per case
    fields: dict[str, Any] = {"max_tokens": 2}
    if stream:
        fields |= {"stream": True, "stream_options": {"include_usage": True}}
    first = usage_of(on, path, make(prompt, **fields))
    assert first["prompt_tokens"] == 260
    assert first["prompt_tokens_details"] == {"cached_tokens": 0}  # as vLLM 0.32
    again = usage_of(on, path, make(prompt, **fields))
    assert again["prompt_tokens_details"] == {"cached_tokens": 256}  # 16 full blocks
    # off (vLLM's default): never reported, although the second request hits the cache
    for _ in range(2):
        assert usage_of(off, path, make(prompt, **fields))["prompt_tokens_details"] is None
    assert off.stats()["prefix_cache_hits_tokens"] > 0
