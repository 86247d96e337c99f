"""P/D with real engines: a prefill and a decode vLLM server sharing KV through a
connector, the EPP's coordinator between them, and the decode server's own counters
as the proof that the prompt's KV arrived by transfer and was not recomputed."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from epp_harness.stack import LocalStack
from tests.support.http import metric_sum, request
from tests.support.wait import wait_for
from tests.vllm.servers import MODEL_NAME, VllmServer, log

PROMPT_TOKENS = "vllm:prompt_tokens_by_source_total"
BLOCK = 128  # the CPU build's block size (checked in test_serving)


def connector_args(config: dict[str, Any]) -> list[str]:
    return ["--kv-transfer-config", json.dumps({"kv_role": "kv_both", **config})]


@dataclass
class Sources:
    """A server's prompt tokens by where their KV came from."""

    computed: float
    cached: float
    transferred: float

    @classmethod
    def of(cls, server: VllmServer) -> Sources:
        text = server.metrics()

        def source(name: str) -> float:
            lines = [ln for ln in text.splitlines() if f'source="{name}"' in ln]
            return metric_sum("\n".join(lines), PROMPT_TOKENS)

        return cls(
            source("local_compute"), source("local_cache_hit"), source("external_kv_transfer")
        )

    def __sub__(self, other: Sources) -> Sources:
        return Sources(
            self.computed - other.computed,
            self.cached - other.cached,
            self.transferred - other.transferred,
        )


def long_prompt(tag: str) -> str:
    """~600 tokens (4+ blocks), new to every server (so the decider disaggregates)."""
    return f"{tag}: " + "The transfer report says the data is in the memory block. " * 45


def check_disaggregated(
    stack: LocalStack, prefill: VllmServer, decode: VllmServer, tag: str, chat: bool
) -> None:
    """One long request through Envoy: the prefill server computes the prompt, the decode
    server receives all its full blocks by transfer and computes at most the last one."""
    before_p, before_d = Sources.of(prefill), Sources.of(decode)
    doc: dict[str, Any] = {"model": MODEL_NAME, "max_tokens": 4}
    if chat:
        doc.update(messages=[{"role": "user", "content": long_prompt(tag)}], stream=True)
        doc["stream_options"] = {"include_usage": True}
        path = "/v1/chat/completions"
    else:
        doc["prompt"] = long_prompt(tag)
        path = "/v1/completions"
    code, _, body = request(
        f"{stack.envoy_url}{path}", json.dumps(doc).encode(), {"x-request-id": tag}, timeout=300
    )
    assert code == 200, body[:500]
    if chat:
        assert body.rstrip().endswith(b"data: [DONE]")
        usage = json.loads(body.split(b"data: ")[-2])["usage"]
    else:
        usage = json.loads(body)["usage"]
    prompt = usage["prompt_tokens"]
    assert prompt > 4 * BLOCK
    p = wait_for(lambda: (d := Sources.of(prefill) - before_p).computed > 0 and d, what="prefill")
    d = Sources.of(decode) - before_d
    log(
        f"{stack.opts.coordinator} {'chat' if chat else 'completion'}: prompt {prompt} tokens; "
        f"prefill server computed {p.computed:.0f}; decode server: transferred "
        f"{d.transferred:.0f}, computed {d.computed:.0f}, cache hits {d.cached:.0f}"
    )
    assert p.computed >= prompt - BLOCK  # the prefill server did the work
    assert d.transferred >= (prompt - 1) // BLOCK * BLOCK  # every full block came over
    assert d.computed < BLOCK  # only the tail was computed on the decode server
    assert d.cached == 0  # nothing came from its own prefix cache


def epp_counter(stack: LocalStack, name: str, label: str) -> float:
    text = request(f"{stack.epp_http_url}/metrics")[2].decode()
    return metric_sum("\n".join(ln for ln in text.splitlines() if label in ln), name)
