"""Precise prefix routing through Envoy: the EPP follows two simulators' KV events and
sends a prompt to the server that really holds its blocks, even after the one it was
routed to evicted them (which the approximate index, knowing only its own routing,
cannot see)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
import yaml

from epp_harness.sim.tokenizer import write_tokenizer_files
from epp_harness.stack import LocalStack
from tests.e2e.conftest import ephemeral
from tests.support.http import metric_sum, request
from tests.support.sim import SimProc, sims
from tests.support.wait import wait_for

pytestmark = pytest.mark.e2e

BS = 16
SIM = [
    "--block-size",
    str(BS),
    "--kv-blocks",
    "48",
    "--time-scale",
    "0",
    "--enable-prompt-tokens-details",
    "--kv-events-port",
    "0",
]
PROMPT = "You answer questions about the tides. " * 9  # 342 bytes: 21 full blocks
FULL = len(PROMPT.encode()) // BS


def epp_config(path: Path, tokenizer: Path, servers: list[SimProc]) -> Path:
    endpoints = "".join(
        f"- address: 127.0.0.1:{s.port}\n"
        f'  labels: {{epp.dev/kv-events: "{s.proc.info["kv_events_port"]}"}}\n'
        for s in servers
    )
    path.write_text(f"""
plugins:
- type: prefix-cache-scorer
- type: precise-prefix-cache-scorer
  parameters: {{tokenizer: {tokenizer}, kvEvents: {{port: 0}}, loadBound: 0}}
- type: queue-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: precise-prefix-cache-scorer
    weight: 10
  - pluginRef: queue-scorer
  - pluginRef: max-score-picker
endpoints:
{endpoints}""")
    return path


def metrics(stack: LocalStack) -> str:
    return request(f"{stack.epp_http_url}/metrics")[2].decode()


def sample(text: str, name: str, *labels: str) -> float:
    lines = [ln for ln in text.splitlines() if all(label in ln for label in labels)]
    return metric_sum("\n".join(lines), name)


def gpu_blocks(stack: LocalStack, sim: SimProc) -> float:
    return sample(
        metrics(stack), "epp_kv_index_blocks", f'endpoint="127.0.0.1:{sim.port}"', 'medium="GPU"'
    )


def complete(url: str, prompt: str) -> tuple[str, int]:
    """(the instance that answered, prompt tokens it served from its cache)."""
    body = orjson.dumps({"model": "sim-model", "prompt": prompt, "max_tokens": 1})
    status, headers, raw = request(f"{url}/v1/completions", body)
    assert status == 200, raw
    details = orjson.loads(raw)["usage"]["prompt_tokens_details"]
    return headers["x-sim-instance"], details["cached_tokens"]


def synced(stack: LocalStack, servers: list[SimProc]) -> None:
    """Both servers' events trusted by the EPP: a probe each until its blocks show (a
    PUB socket drops what it sends before the subscription reaches it), then a cache
    reset each (AllBlocksCleared: an empty cache is known state)."""
    for sim in servers:
        probes = iter(range(1000))

        def seen(sim: SimProc = sim, probes: Iterator[int] = probes) -> bool:
            complete(sim.url, f"probe {next(probes)} " * 4)
            return gpu_blocks(stack, sim) > 0

        wait_for(seen, timeout=20, what=f"the EPP to see {sim.url}'s events")
        assert sim.post("/reset_prefix_cache", {})[0] == 200
    wait_for(
        lambda: sample(metrics(stack), "epp_kv_index_endpoints", 'state="trusted"') == 2,
        timeout=20,
        what="both servers trusted",
    )


def test_a_prefix_moves_with_the_server_that_really_holds_it(tmp_path: Path) -> None:
    tokenizer = write_tokenizer_files(tmp_path / "tokenizer")
    with sims(tmp_path, SIM, SIM) as servers:
        config = epp_config(tmp_path / "epp.yaml", tokenizer, servers)
        opts = ephemeral(servers=0, epp_args=["--config", str(config)])
        with LocalStack(opts) as stack:
            synced(stack, servers)
            by_instance = {s.proc.info["instance"]: s for s in servers}
            first, _ = complete(stack.envoy_url, PROMPT)
            home = by_instance[first]
            other = next(s for s in servers if s is not home)
            wait_for(lambda: gpu_blocks(stack, home) >= FULL, what="the prompt's blocks")
            again, cached = complete(stack.envoy_url, PROMPT + " Why?")
            assert (again, cached) == (first, FULL * BS)  # the prefix stays home

            # home evicts the prompt (fillers sent to it directly), the other server
            # caches it (sent directly too): only KV events tell the EPP
            for i in range(2):
                complete(home.url, f"filler {i} " * 50)
            complete(other.url, PROMPT)
            wait_for(
                lambda: (
                    sample(metrics(stack), "epp_kv_index_blocks_changed_total", 'kind="removed"')
                    >= FULL
                    and gpu_blocks(stack, other) >= FULL
                ),
                what="the eviction and the new copy in the EPP's index",
            )
            moved, cached = complete(stack.envoy_url, PROMPT + " And when?")
            assert moved == other.proc.info["instance"]
            assert cached == FULL * BS  # served from the cache the events described
            text = metrics(stack)
            assert sample(text, "epp_kv_event_total", 'kind="decode_errors"') == 0
            assert sample(text, "epp_kv_event_total", 'kind="messages"') >= 4


def test_the_stack_wires_kv_events_for_a_shipped_config(tmp_path: Path) -> None:
    """`epp stack --kv-events --config configs/precise-prefix.yaml`: the simulators
    publish, the EPP is given each one's publisher and their tokenizer, its index fills
    from the events, and a repeated prompt stays with its server's cache."""
    config = Path(__file__).resolve().parents[2] / "configs" / "precise-prefix.yaml"
    opts = ephemeral(
        servers=2,
        kv_events=True,
        sim_args=["--time-scale", "0"],
        epp_args=["--config", str(config)],
        workdir=tmp_path,
    )
    with LocalStack(opts) as stack:
        doc = yaml.safe_load((tmp_path / "epp-config.yaml").read_text())
        labels = [e["labels"]["epp.dev/kv-events"] for e in doc["endpoints"]]
        assert labels == [f"127.0.0.1:{s.info['kv_events_port']}" for s in stack.sims]
        (precise,) = [p for p in doc["plugins"] if p["type"] == "precise-prefix-cache-scorer"]
        assert (Path(precise["parameters"]["tokenizer"]) / "tokenizer.json").is_file()
        first, _ = complete(stack.envoy_url, PROMPT)
        home = next(s for s in stack.sims if s.info["instance"] == first)
        wait_for(
            lambda: sample(
                metrics(stack), "epp_kv_index_blocks", f'endpoint="{home.info["host"]}:'
                f'{home.info["port"]}"', 'medium="GPU"'
            ) >= FULL,
            what="the prompt's blocks in the EPP's index",
        )  # fmt: skip
        for question in ("Why?", "When?", "Where?"):
            again, cached = complete(stack.envoy_url, f"{PROMPT} {question}")
            assert (again, cached) == (first, FULL * BS)
        text = metrics(stack)
        assert sample(text, "epp_kv_index_endpoints", 'state="trusted"') >= 1  # from seq 0
        assert sample(text, "epp_kv_event_total", 'kind="decode_errors"') == 0
        # the simulators' byte tokenizer (a character a token), learned from their usage
        # after four prompts of ~350 characters (from 4, weighted as 1,000 tokens)
        assert 1.0 <= sample(text, "epp_prompt_chars_per_token") < 2.5
