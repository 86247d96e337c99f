"""Build the real-engine tier's model offline: a tiny random Llama and a small byte-level
BPE tokenizer trained on generated text, with a chat template. No hub download.

Run with the vLLM venv's interpreter (it has torch, transformers, tokenizers):
``.venv-vllm/bin/python tests/vllm/build_model.py DIR``. Reuses DIR if it is complete.
The tokenizer's files are also committed under tests/fixtures/tiny-llama/ (see its
README); a build copies those when present, so the fixture's token ids stay valid.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

VOCAB = 1024
SEED = 16
FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "tiny-llama"
# role headers, the message, an end-of-turn token; the engine adds nothing else for chat
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}</s>\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
TEXT = (
    "the a report system user model server cache prefix block token request answer "
    "question summarize following data engine route decode prefill transfer memory "
    "hello world please explain how why what when where it is was are be of to in and "
    "for on with as by at from this that these those first second third last next"
)


def corpus() -> list[str]:
    """Deterministic text with the words and digits prompts use."""
    words_ = TEXT.split()
    lines = []
    for i in range(4000):
        words = [words_[(i * 7 + j * 13) % len(words_)] for j in range(12)]
        lines.append(" ".join(words) + f" {i}. " + " ".join(w.capitalize() for w in words[:3]))
    return lines


def build_tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus(), trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        chat_template=CHAT_TEMPLATE,
    )
    fast.save_pretrained(str(out))


def build_model(out: Path, vocab: int) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,  # head size 64: one the CPU attention kernels take
        num_key_value_heads=2,
        max_position_embeddings=4096,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(str(out), safe_serialization=True)


def main(out: Path) -> None:
    if (out / "config.json").exists() and all((out / f).exists() for f in FILES):
        print(f"tiny model: reusing {out}", flush=True)
        return
    out.mkdir(parents=True, exist_ok=True)
    if all((FIXTURE / f).exists() for f in FILES):
        for f in FILES:
            shutil.copy(FIXTURE / f, out / f)
    else:
        build_tokenizer(out)
    vocab = len(json.loads((out / "tokenizer.json").read_text())["model"]["vocab"])
    build_model(out, max(vocab, VOCAB))
    print(f"tiny model: built in {out} (vocab {vocab})", flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
