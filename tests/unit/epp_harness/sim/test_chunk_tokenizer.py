"""The simulator's counting tokenizer: its own code, the Hugging Face files it writes
(read by the ``tokenizers`` library, as a benchmark client or the EPP would) and the
simulator's prompt-token count all agree."""

from __future__ import annotations

import random
from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from epp.common.tokenization import CHAT, HfTokenizer, prompt_token_ids
from epp_harness.sim import chunk_tokenizer
from epp_harness.sim.protocol import ApiKind, parse_request

VOCAB = chunk_tokenizer.UNKNOWN_ID + 1
REAL_TEXT = (Path(__file__).resolve().parents[4] / "docs" / "simulator.md").read_text()


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return chunk_tokenizer.write_tokenizer_files(tmp_path_factory.mktemp("chunk"))


@pytest.fixture(scope="module")
def epp_tokenizer(files: Path) -> HfTokenizer:
    return HfTokenizer(files)


@pytest.fixture(scope="module")
def hf(files: Path) -> Tokenizer:
    return Tokenizer.from_file(str(files / "tokenizer.json"))


def sim_prompt_tokens(kind: ApiKind, body: dict[str, object]) -> int:
    """usage.prompt_tokens the simulator (without KV events) reports for ``body``."""
    raw = orjson.dumps({"model": "m", **body})
    return parse_request(kind, raw, served_model="m", default_max_tokens=1).prompt_tokens


def test_the_vocabulary_covers_every_id_once(hf: Tokenizer) -> None:
    vocab = hf.get_vocab()
    assert hf.get_vocab_size() == VOCAB and sorted(vocab.values()) == list(range(VOCAB))
    assert all(len(text) == 4 for text in vocab)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, VOCAB - 1), max_size=300))
def test_any_ids_decode_to_text_that_counts_as_many_tokens(hf: Tokenizer, ids: list[int]) -> None:
    text = hf.decode(ids)
    assert len(hf.encode(text).ids) == len(ids)
    assert sim_prompt_tokens(ApiKind.COMPLETION, {"prompt": text or "x"}) == max(len(ids), 1)


def test_long_random_prompts_count_exactly(hf: Tokenizer) -> None:
    """inference-perf's shared_prefix case: 1,500 random ids, then 150 more."""
    rng = random.Random(7)
    for _ in range(20):
        prefix = [rng.randrange(VOCAB) for _ in range(1500)]
        ids = prefix + [rng.randrange(VOCAB) for _ in range(150)]
        text = hf.decode(ids)
        assert hf.encode(text).ids == ids
        assert sim_prompt_tokens(ApiKind.COMPLETION, {"prompt": text}) == 1650
        chat: dict[str, object] = {"messages": [{"role": "user", "content": text}]}
        assert sim_prompt_tokens(ApiKind.CHAT, chat) == 1650


@settings(max_examples=300, deadline=None)
@given(st.text(st.characters(exclude_categories=("Cs",)), max_size=80))
def test_the_files_encode_any_text_as_the_simulator_does(hf: Tokenizer, text: str) -> None:
    assert hf.encode(text).ids == chunk_tokenizer.encode(text)
    assert len(chunk_tokenizer.encode(text)) == chunk_tokenizer.count_tokens(text)
    assert "".join(chunk_tokenizer.token_keys(text)) == text


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=chunk_tokenizer.ALPHABET, max_size=80))
def test_text_over_the_alphabet_encodes_losslessly(hf: Tokenizer, text: str) -> None:
    ids = hf.encode(text).ids
    complete = len(text) // 4 * 4
    assert hf.decode(ids[: len(text) // 4]) == text[:complete]


def test_real_text_agrees_line_by_line_and_whole(hf: Tokenizer) -> None:
    assert hf.encode(REAL_TEXT).ids == chunk_tokenizer.encode(REAL_TEXT)
    for line in REAL_TEXT.splitlines():
        ids = hf.encode(line).ids
        assert ids == chunk_tokenizer.encode(line)
        if line:
            assert len(ids) == sim_prompt_tokens(ApiKind.COMPLETION, {"prompt": line})


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["system", "user", "assistant"]),
            st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=30),
        ),
        min_size=1,
        max_size=4,
    )
)
def test_a_chat_counts_in_the_epp_as_in_the_simulator(
    epp_tokenizer: HfTokenizer, messages: list[tuple[str, str]]
) -> None:
    """The written chat template, rendered by the EPP's tokenization (jinja2 +
    ``tokenizers``), gives the simulator's chat count."""
    body: dict[str, object] = {"messages": [{"role": r, "content": c} for r, c in messages]}
    ids = prompt_token_ids(CHAT, body, epp_tokenizer)
    assert ids is not None and len(ids) == sim_prompt_tokens(ApiKind.CHAT, body)
