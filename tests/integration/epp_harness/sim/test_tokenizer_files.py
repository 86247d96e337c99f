"""``epp sim --write-tokenizer DIR`` writes the tokenizer the instance counts with: a
client that loads it and builds prompts from random token ids (inference-perf's
``shared_prefix`` data) gets exactly the prompt length it asked for in
``usage.prompt_tokens``; with KV events the files give the instance's own token ids."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from tokenizers import Tokenizer

from tests.support.sim import SimProc, chat, completion, sims


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[list[SimProc], Path]]:
    """One simulator in its default mode, one publishing KV events, each writing its
    tokenizer into a directory of its own."""
    workdir = tmp_path_factory.mktemp("sim-tokenizer")
    fast = ["--time-scale", "0"]
    plain = [*fast, "--write-tokenizer", str(workdir / "plain")]
    events = [*fast, "--kv-events-port", "0", "--write-tokenizer", str(workdir / "events")]
    with sims(workdir, plain, events) as both:
        yield both, workdir


def prompt_tokens(sim: SimProc, path: str, body: dict[str, object]) -> int:
    status, raw = sim.post(path, {**body, "max_tokens": 1})
    assert status == 200, raw
    count: int = orjson.loads(raw)["usage"]["prompt_tokens"]
    return count


def test_random_ids_give_the_prompt_length_asked_for(
    written: tuple[list[SimProc], Path],
) -> None:
    (plain, _), workdir = written
    tok = Tokenizer.from_file(str(workdir / "plain" / "tokenizer.json"))
    rng = random.Random(3)
    for length in (1, 7, 150, 1500):
        ids = [rng.randrange(tok.get_vocab_size()) for _ in range(length)]
        text = tok.decode(ids)
        assert len(tok.encode(text).ids) == length
        assert prompt_tokens(plain, "/v1/completions", completion(text)) == length
        assert prompt_tokens(plain, "/v1/chat/completions", chat(text)) == length


def test_with_kv_events_the_files_give_the_instances_token_ids(
    written: tuple[list[SimProc], Path],
) -> None:
    (_, events), workdir = written
    tok = Tokenizer.from_file(str(workdir / "events" / "tokenizer.json"))
    text = "Grüße, 世界: a prompt with some bytes beyond ASCII\n"
    status, raw = events.post("/tokenize", {"prompt": text})
    assert status == 200 and orjson.loads(raw)["tokens"] == tok.encode(text).ids
    assert prompt_tokens(events, "/v1/completions", completion(text)) == len(tok.encode(text).ids)
