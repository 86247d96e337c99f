"""Prompt tokenization as the engine does it (epp.common.tokenization), with tokenizers built
here, offline: a small BPE trained on a few sentences (with a BOS post-processor and a
chat template, like a real model's files), and the simulator's own byte tokenizer
written as Hugging Face files, checked against the simulator's independent code.
Token ids captured from a real vLLM's /tokenize come with the real-engine tier
(`make test-vllm`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers

from epp.common.tokenization import CHAT, COMPLETIONS, HfTokenizer, TokenizerError, prompt_token_ids
from epp_harness.sim import tokenizer as sim_tokenizer
from epp_harness.sim.protocol import ApiKind

CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "a system prompt tells the assistant how to answer the user",
    "user: what is the weather like today? assistant: sunny",
] * 20

TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] == 'system' %}[SYS]{{ m['content'] }}[/SYS]\n"
    "{% else %}<{{ m['role'] }}>{{ m['content'] }}{{ eos_token }}\n{% endif %}"
    "{% endfor %}"
    "{% if tools %}[TOOLS]{{ tools | tojson }}\n{% endif %}"
    "{% if think is defined %}[think={{ think }}]{% endif %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("tok")
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))]
    )
    tok.save(str(directory / "tokenizer.json"))
    config = {
        "bos_token": {"content": "<s>", "special": True},  # the AddedToken form
        "eos_token": "</s>",
        "chat_template": [
            {"name": "default", "template": TEMPLATE},
            {"name": "tool_use", "template": "TOOLS " + TEMPLATE},
        ],
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


@pytest.fixture(scope="module")
def hf(model_dir: Path) -> HfTokenizer:
    return HfTokenizer(model_dir)


@pytest.fixture(scope="module")
def raw(model_dir: Path) -> Tokenizer:
    return Tokenizer.from_file(str(model_dir / "tokenizer.json"))


def chat(*messages: tuple[str, Any], **fields: Any) -> dict[str, Any]:
    return {"messages": [{"role": r, "content": c} for r, c in messages], **fields}


def test_completions_add_special_tokens_unless_told_not_to(hf: HfTokenizer, raw: Tokenizer) -> None:
    text = "the quick brown fox"
    ids = prompt_token_ids(COMPLETIONS, {"prompt": text}, hf)
    assert ids == raw.encode(text).ids and ids[0] == raw.token_to_id("<s>")
    plain = prompt_token_ids(COMPLETIONS, {"prompt": text, "add_special_tokens": False}, hf)
    assert plain == ids[1:]


def test_token_id_prompts_need_no_tokenizer() -> None:
    assert prompt_token_ids(COMPLETIONS, {"prompt": [5, 6, 7]}, None) == [5, 6, 7]
    assert prompt_token_ids(COMPLETIONS, {"prompt": [[1, 2], [3]]}, None) == [1, 2]
    assert prompt_token_ids(COMPLETIONS, {"prompt": "text"}, None) is None
    assert prompt_token_ids(COMPLETIONS, {"prompt": [1, "x"]}, None) is None
    assert prompt_token_ids(COMPLETIONS, {"prompt": []}, None) is None
    assert prompt_token_ids(CHAT, chat(("user", "hi")), None) is None
    assert prompt_token_ids("/v1/embeddings", {"input": "x"}, None) is None
    assert prompt_token_ids(COMPLETIONS, None, None) is None


def test_a_batch_of_prompts_is_matched_by_its_first(hf: HfTokenizer) -> None:
    first = prompt_token_ids(COMPLETIONS, {"prompt": "the lazy dog"}, hf)
    assert prompt_token_ids(COMPLETIONS, {"prompt": ["the lazy dog", "other"]}, hf) == first


def test_chat_renders_the_template_and_encodes_without_adding_specials(
    hf: HfTokenizer, raw: Tokenizer
) -> None:
    body = chat(("system", "be brief"), ("user", "what is the weather"))
    text = hf.render_chat(body)
    assert text == "<s>[SYS]be brief[/SYS]\n<user>what is the weather</s>\n<assistant>"
    ids = prompt_token_ids(CHAT, body, hf)
    assert ids == raw.encode(text, add_special_tokens=False).ids
    assert ids.count(raw.token_to_id("<s>")) == 1  # the template's BOS, not a second one
    doubled = prompt_token_ids(CHAT, {**body, "add_special_tokens": True}, hf)
    assert doubled == [raw.token_to_id("<s>"), *ids]


def test_chat_request_fields_reach_the_template(hf: HfTokenizer) -> None:
    body = chat(("user", "hi"))
    assert hf.render_chat({**body, "add_generation_prompt": False}) == "<s><user>hi</s>\n"
    kwargs = hf.render_chat({**body, "chat_template_kwargs": {"think": False}})
    assert kwargs == "<s><user>hi</s>\n[think=False]<assistant>"
    tools = [{"type": "function", "function": {"name": "météo"}}]
    rendered = hf.render_chat({**body, "tools": tools})
    assert rendered is not None and rendered.startswith("TOOLS <s>")  # the tool_use template
    assert '"name": "météo"' in rendered  # tojson keeps non-ASCII


def test_content_parts_are_joined_by_newlines_and_images_give_up(hf: HfTokenizer) -> None:
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    assert hf.render_chat(chat(("user", parts))) == "<s><user>a\nb</s>\n<assistant>"
    assert hf.render_chat(chat(("user", None))) == "<s><user></s>\n<assistant>"
    image = [{"type": "image_url", "image_url": {"url": "x"}}]
    assert prompt_token_ids(CHAT, chat(("user", image)), hf) is None
    assert prompt_token_ids(CHAT, {**chat(("user", "x")), "chat_template": "{{x}}"}, hf) is None
    assert prompt_token_ids(CHAT, {"messages": [{"content": "no role"}]}, hf) is None


def test_continue_final_message_ends_at_its_content(hf: HfTokenizer) -> None:
    body = chat(("user", "hi"), ("assistant", "sunny and "), continue_final_message=True)
    assert hf.render_chat(body) == "<s><user>hi</s>\n<assistant>sunny and"


def test_a_template_that_raises_gives_none_and_is_counted(tmp_path: Path, raw: Tokenizer) -> None:
    raw.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text("{}")
    (tmp_path / "chat_template.jinja").write_text(
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}"
        "{% for m in messages %}{% generation %}{{ m['content'] }}{% endgeneration %}"
        "{% endfor %}{{ strftime_now('%Y')[:2] }}"
    )
    tok = HfTokenizer(tmp_path)
    assert tok.render_chat(chat(("user", "a"), ("assistant", "b"))) == "ab20"
    assert prompt_token_ids(CHAT, chat(("system", "x")), tok) is None
    assert tok.failures == 1


def test_no_template_no_chat(tmp_path: Path, raw: Tokenizer) -> None:
    raw.save(str(tmp_path / "tokenizer.json"))
    assert HfTokenizer(tmp_path).render_chat(chat(("user", "x"))) is None


def test_unusable_directories_raise_tokenizer_errors(tmp_path: Path, raw: Tokenizer) -> None:
    with pytest.raises(TokenizerError, match=r"tokenizer\.json"):
        HfTokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(TokenizerError, match="cannot load"):
        HfTokenizer(tmp_path)
    raw.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text('{"chat_template": "{% if %}"}')
    with pytest.raises(TokenizerError, match="chat template 'default'"):
        HfTokenizer(tmp_path)


def test_a_template_failing_in_its_own_code_gives_none(tmp_path: Path, raw: Tokenizer) -> None:
    raw.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "chat_template.jinja").write_text("{{ messages[0]['content'] + 5 }}")
    tok = HfTokenizer(tmp_path)
    assert prompt_token_ids(CHAT, chat(("user", "x")), tok) is None and tok.failures == 1


# -- the simulator's tokenizer: its own code against its Hugging Face files ---------------
@pytest.fixture(scope="module")
def sim_files(tmp_path_factory: pytest.TempPathFactory) -> HfTokenizer:
    return HfTokenizer(sim_tokenizer.write_tokenizer_files(tmp_path_factory.mktemp("sim")))


@settings(max_examples=200, deadline=None)
@given(st.text(st.characters(exclude_categories=("Cs",)), max_size=60))
def test_the_simulators_files_encode_as_the_simulator_does(
    sim_files: HfTokenizer, text: str
) -> None:
    assert prompt_token_ids(COMPLETIONS, {"prompt": text}, sim_files) == sim_tokenizer.encode(text)


@settings(max_examples=50, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["system", "user", "assistant"]), st.text(max_size=20)),
        min_size=1,
        max_size=4,
    ),
    st.booleans(),
)
def test_the_simulators_chat_template_renders_as_the_simulator_does(
    sim_files: HfTokenizer, messages: list[tuple[str, str]], generation_prompt: bool
) -> None:
    body = chat(*messages, add_generation_prompt=generation_prompt)
    ids = prompt_token_ids(CHAT, body, sim_files)
    assert ids == sim_tokenizer.request_token_ids(ApiKind.CHAT, body)


TINY_LLAMA = Path(__file__).resolve().parents[2] / "fixtures" / "tiny-llama"


def test_reproduces_the_token_ids_a_real_vllm_returned() -> None:
    """The real-engine tier's tokenizer files and the ids vLLM 0.32's /tokenize gave for
    them (tests/fixtures/tiny-llama/README.md), offline."""
    fixture = json.loads((TINY_LLAMA / "tokenize.json").read_text())
    hf = HfTokenizer(TINY_LLAMA)
    for case in fixture["completions"]:
        got = prompt_token_ids(COMPLETIONS, {"prompt": case["prompt"]}, hf)
        assert got == case["tokens"], case["prompt"]
    for case in fixture["chat"]:
        got = prompt_token_ids(CHAT, {"messages": case["messages"]}, hf)
        assert got == case["tokens"], case["messages"]


def test_messages_are_rendered_as_the_chat_request_vllm_makes(hf: HfTokenizer) -> None:
    doc = {
        "model": "m",
        "max_tokens": 4,
        "system": [{"type": "text", "text": "be brief"}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "what is the weather"}]}
        ],
    }
    chat_ids = prompt_token_ids(
        CHAT, chat(("system", "be brief"), ("user", "what is the weather")), hf
    )
    assert prompt_token_ids("/v1/messages", doc, hf) == chat_ids is not None
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA"}}
    with_image = {**doc, "messages": [{"role": "user", "content": [image]}]}
    assert prompt_token_ids("/v1/messages", with_image, hf) is None


def test_generate_apis_give_their_token_ids() -> None:
    assert prompt_token_ids("/inference/v1/generate", {"token_ids": [4, 5]}, None) == [4, 5]
    assert prompt_token_ids("/generate", {"input_ids": [[1, 2], [3]]}, None) == [1, 2]
    assert prompt_token_ids("/generate", {"text": "x"}, None) is None
