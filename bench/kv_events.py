"""KV events and the precise prefix index: what they cost on one core.

* index update: BlockStored events (16-token blocks, 8 per event, 4 events per message,
  chains continued through parent links) and BlockRemoved keeping it at its cap, as
  decoded events and from msgpack bytes (decode + apply); blocks stored per second;
* lookup: a 2,048-token prompt against 1,000 endpoints that hold parts of it (tokens
  cut into blocks and hashed, then the chain walked);
* a decision with the precise scorer at 1,000 endpoints (token-id prompt: no tokenizer);
* tokenization per request with the ``tokenizers`` library: a byte-level BPE of 8,000
  tokens trained here on the standard library's sources (no model is downloaded), for
  completions prompts of several sizes and a chat request through a template.

About 10 s (``make bench-kv-events``, also part of ``make bench``). Writes
bench/results/kv-events.{md,json}.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import sysconfig
import tempfile
import time
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import orjson

from bench.host import machine_description
from epp.common.tokenization import CHAT, COMPLETIONS, HfTokenizer, prompt_token_ids
from epp.config import build_scheduler
from epp.kvevents.index import PreciseIndex, chain_keys, token_bytes
from epp.kvevents.wire import BlockRemoved, BlockStored, KvEvent, decode_batch
from epp.scheduling.plugins.precise import PrecisePrefixCacheScorer
from epp.types import Endpoint, EndpointState, InferenceRequest, Snapshot

RESULTS = Path(__file__).resolve().parent / "results"
BS = 16
VOCAB = 50_000


def stored_stream(blocks: int, rng: random.Random) -> list[list[KvEvent]]:
    """Messages of 4 BlockStored events of 8 blocks; half continue an earlier chain.
    Each message also removes as many old blocks as it stores once 60,000 are held."""
    messages: list[list[KvEvent]] = []
    heads: list[int] = []
    next_hash = 1
    oldest = 1
    while next_hash <= blocks:
        events: list[KvEvent] = []
        for _ in range(4):
            parent = rng.choice(heads) if heads and rng.random() < 0.5 else None
            hashes = tuple(range(next_hash, next_hash + 8))
            next_hash += 8
            tokens = array("q", (rng.randrange(VOCAB) for _ in range(8 * BS)))
            events.append(BlockStored(hashes, parent, tokens, BS, medium="GPU"))
            heads.append(hashes[-1])
            heads = heads[-64:]
            if next_hash - oldest > 60_000:  # evictions keep the index at a steady size
                events.extend(BlockRemoved((h,), "GPU") for h in range(oldest, oldest + 8))
                oldest += 8
        messages.append(events)
    return messages


def payloads(messages: list[list[KvEvent]]) -> list[bytes]:
    def wire(event: KvEvent) -> dict[str, Any]:
        if isinstance(event, BlockStored):
            return {
                "type": "BlockStored",
                "block_hashes": list(event.block_hashes),
                "parent_block_hash": event.parent_block_hash,
                "token_ids": event.token_ids.tolist(),
                "block_size": BS,
                "lora_id": None,
                "medium": "GPU",
                "lora_name": None,
            }
        assert isinstance(event, BlockRemoved)
        return {"type": "BlockRemoved", "block_hashes": list(event.block_hashes), "medium": "GPU"}

    return [msgspec.msgpack.encode([time.time(), [wire(e) for e in m], 0]) for m in messages]


def index_update(blocks: int) -> dict[str, float]:
    messages = stored_stream(blocks, random.Random(1))
    raw = payloads(messages)
    stored = sum(len(e.block_hashes) for m in messages for e in m if isinstance(e, BlockStored))
    index = PreciseIndex()
    index.reset("a", 0.0, complete=True)
    start = time.perf_counter()
    for events in messages:
        index.apply("a", events, 0.0)
    applied = time.perf_counter() - start
    index = PreciseIndex()
    index.reset("a", 0.0, complete=True)
    start = time.perf_counter()
    for payload in raw:
        index.apply("a", decode_batch(payload).events, 0.0)
    decoded = time.perf_counter() - start
    return {
        "blocks": stored,
        "apply_blocks_per_s": stored / applied,
        "decode_apply_blocks_per_s": stored / decoded,
        "index_blocks_after": index.size(),
    }


def timed(fn: Callable[[], object], rounds: int) -> dict[str, float]:
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    samples.sort()
    return {
        "p50_us": statistics.median(samples) * 1e6,
        "p99_us": samples[int(len(samples) * 0.99) - 1] * 1e6,
    }


def lookup(endpoints: int, rounds: int) -> dict[str, float]:
    rng = random.Random(2)
    prompt = [rng.randrange(VOCAB) for _ in range(2048)]
    index = PreciseIndex()
    for i in range(endpoints):  # each holds the prompt's first k blocks, k varies
        address = f"10.0.{i // 256}.{i % 256}:8000"
        index.reset(address, 0.0, complete=True)
        held = rng.randrange(1, 128)
        tokens = array("q", prompt[: held * BS])
        index.apply(address, [BlockStored(tuple(range(1, held + 1)), None, tokens, BS)], 0.0)
    packed = token_bytes(prompt)
    root = index.root("")

    def once() -> None:
        index.match(chain_keys(packed, BS, 512, root))

    return timed(once, rounds)


def decision(endpoints: int, rounds: int) -> dict[str, float]:
    sched = build_scheduler(
        "plugins:\n- type: prefix-cache-scorer\n- type: precise-prefix-cache-scorer\n"
        "- type: queue-scorer\n- type: max-score-picker\n"
    )
    scorer = sched.plugins["precise-prefix-cache-scorer"]
    assert isinstance(scorer, PrecisePrefixCacheScorer)
    rng = random.Random(3)
    systems = [[rng.randrange(VOCAB) for _ in range(1024)] for _ in range(10)]
    states = tuple(
        EndpointState(Endpoint(f"10.1.{i // 256}.{i % 256}", 8000)) for i in range(endpoints)
    )
    for i, s in enumerate(states):
        scorer.index.reset(s.address, 0.0, complete=True)
        tokens = array("q", systems[i % 10])
        scorer.index.apply(s.address, [BlockStored(tuple(range(1, 65)), None, tokens, BS)], 0.0)
    snapshot = Snapshot(states, {s.address: 0 for s in states})
    prompts = [
        [*rng.choice(systems), *(rng.randrange(VOCAB) for _ in range(1024))] for _ in range(rounds)
    ]
    requests = iter(
        [InferenceRequest("r", "m", COMPLETIONS, body={"model": "m", "prompt": p}) for p in prompts]
    )

    def once() -> None:
        sched.schedule(next(requests), snapshot, rng)

    return timed(once, rounds)


def trained_tokenizer(directory: Path) -> HfTokenizer:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    sources = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    text = [p.read_text(errors="replace") for p in sources[:120]]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=8000, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(text, trainer)
    tok.save(str(directory / "tokenizer.json"))
    template = (
        "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
    )
    (directory / "tokenizer_config.json").write_text(
        orjson.dumps({"chat_template": template}).decode()
    )
    return HfTokenizer(directory)


def tokenization(rounds: int) -> dict[str, dict[str, float]]:
    words = Path(sysconfig.get_paths()["stdlib"], "argparse.py").read_text().split()
    rng = random.Random(4)
    found = {}
    with tempfile.TemporaryDirectory() as tmp:
        tok = trained_tokenizer(Path(tmp))
        for chars in (4_000, 16_000, 64_000):
            text = " ".join(rng.choice(words) for _ in range(chars // 6))[:chars]
            body = {"prompt": text}
            tokens = len(prompt_token_ids(COMPLETIONS, body, tok) or [])
            cell = timed(lambda body=body: prompt_token_ids(COMPLETIONS, body, tok), rounds)
            found[f"completion {chars // 1000}k chars ({tokens} tokens)"] = cell
        chat = {
            "messages": [
                {"role": "system", "content": text[:8000]},
                {"role": "user", "content": text[8000:12000]},
            ]
        }
        tokens = len(prompt_token_ids(CHAT, chat, tok) or [])
        cell = timed(lambda: prompt_token_ids(CHAT, chat, tok), rounds)
        found[f"chat 12k chars ({tokens} tokens)"] = cell
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blocks", type=int, default=200_000, help="blocks stored")
    parser.add_argument("--rounds", type=int, default=300, help="timed lookups / decisions")
    parser.add_argument("--name", default="kv-events")
    args = parser.parse_args(argv)
    results: dict[str, Any] = {"host": machine_description()}
    results["index_update"] = index_update(args.blocks)
    results["lookup_2048_tokens_1000_endpoints"] = lookup(1000, args.rounds)
    results["decision_precise_1000_endpoints"] = decision(1000, args.rounds)
    results["tokenization"] = tokenization(max(args.rounds // 5, 20))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.name}.json").write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))
    up = results["index_update"]
    lines = [
        "# KV events: index update, lookup and tokenization cost (one core)",
        "",
        f"Host: {results['host']}. Produced by `python -m bench.kv_events`.",
        "",
        f"- index update: {up['apply_blocks_per_s']:,.0f} blocks/s applied "
        f"({up['decode_apply_blocks_per_s']:,.0f} blocks/s with msgpack decoding), "
        f"{up['blocks']:,} blocks of {BS} tokens",
    ]
    for key in ("lookup_2048_tokens_1000_endpoints", "decision_precise_1000_endpoints"):
        cell = results[key]
        lines.append(
            f"- {key.replace('_', ' ')}: p50 {cell['p50_us']:.0f} µs, p99 {cell['p99_us']:.0f} µs"
        )
    lines += ["", "| tokenization (tokenizers, 8k BPE) | p50 µs | p99 µs |", "|---|---|---|"]
    for label, cell in results["tokenization"].items():
        lines.append(f"| {label} | {cell['p50_us']:.0f} | {cell['p99_us']:.0f} |")
    text = "\n".join(lines) + "\n"
    (RESULTS / f"{args.name}.md").write_text(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
