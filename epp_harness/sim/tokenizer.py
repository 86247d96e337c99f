"""The simulator's own tokenizer: one token per UTF-8 byte (ids 0-255), and a chat
template of its own; used when the simulator publishes KV events (their blocks carry
token ids) and by ``POST /tokenize``.

It is deliberately trivial, and implemented here without any tokenizer library, so
that the EPP's tokenization (the ``tokenizers`` library reading ``tokenizer.json``,
jinja2 rendering the template from ``tokenizer_config.json``) is checked against an
independent implementation: :func:`write_tokenizer_files` writes the same tokenizer
as Hugging Face files (a byte-level BPE without merges), which the EPP loads as it
would a real model's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from epp_harness.sim.hf_files import write_hf_tokenizer
from epp_harness.sim.protocol import ApiKind, GenerationRequest, SimError, bad_request

# what the template below renders, written once in jinja for the EPP and once in Python
# (render_chat) for the simulator
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)


def encode(text: str) -> list[int]:
    """The token ids of ``text``: its UTF-8 bytes."""
    return list(text.encode("utf-8", "replace"))


def message_content(message: Mapping[str, Any]) -> str:
    """A message's content as text: a list of parts is its text parts joined by
    newlines, as vLLM passes it to a template that expects a string."""
    content = message.get("content")
    if isinstance(content, list):
        return "\n".join(
            str(part.get("text", ""))
            for part in content
            if isinstance(part, dict) and part.get("type") == "text"
        )
    return content if isinstance(content, str) else ""


def render_chat(messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True) -> str:
    """The prompt text of a chat request, as :data:`CHAT_TEMPLATE` renders it."""
    text = "".join(f"<|{m.get('role')}|>\n{message_content(m)}<|end|>\n" for m in messages)
    return text + "<|assistant|>\n" if add_generation_prompt else text


def request_token_ids(kind: ApiKind, body: Mapping[str, Any]) -> list[int]:
    """The prompt of a validated request as token ids (completions with several
    prompts: their texts concatenated, as the simulator serves them as one)."""
    if kind is ApiKind.CHAT:
        messages = body.get("messages") or []
        return encode(render_chat(messages, body.get("add_generation_prompt", True) is not False))
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], str):
        ids = prompt if isinstance(prompt[0], int) else [t for p in prompt for t in p]
        return list(ids)
    return encode(prompt if isinstance(prompt, str) else "".join(prompt or []))


def tokenized(req: GenerationRequest) -> GenerationRequest:
    """``req`` with its prompt as token ids (what the engine caches and announces)."""
    ids = request_token_ids(req.kind, req.body)
    return dataclasses.replace(req, prompt_token_ids=tuple(ids), prompt_tokens=len(ids))


def tokenize_body(doc: Any, served_model: str, max_model_len: int) -> dict[str, Any]:
    """The answer to ``POST /tokenize`` (vLLM's shape); raises SimError."""
    if not isinstance(doc, dict):
        raise bad_request("The request body must be a JSON object")
    model = doc.get("model")
    if model is not None and model != served_model:
        raise SimError(404, f"The model `{model}` does not exist.")
    if isinstance(doc.get("messages"), list):
        ids = request_token_ids(ApiKind.CHAT, doc)
    elif isinstance(doc.get("prompt"), str):
        ids = encode(doc["prompt"])
    else:
        raise bad_request("give `prompt` (a string) or `messages` (a list)")
    return {"count": len(ids), "max_model_len": max_model_len, "tokens": ids, "token_strs": None}


def _byte_symbols() -> list[str]:
    """The character the byte-level pre-tokenizer stands each byte for: printable
    Latin-1 bytes stand for themselves, the other 68 for code points from 256 up, in
    byte order (the GPT-2 scheme, which ``tokenizers``' ByteLevel uses)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    symbols: list[str] = []
    extra = 0
    for byte in range(256):
        if byte in printable:
            symbols.append(chr(byte))
        else:
            symbols.append(chr(256 + extra))
            extra += 1
    return symbols


def write_tokenizer_files(directory: Path) -> Path:
    """Write this tokenizer as ``tokenizer.json`` + ``tokenizer_config.json`` (with the
    chat template) into ``directory``, for the EPP's ``tokenizer`` parameter."""
    byte_level = {
        "type": "ByteLevel",
        "add_prefix_space": False,
        "trim_offsets": False,
        "use_regex": False,
    }
    model: dict[str, Any] = {
        "type": "BPE",
        "dropout": None,
        "unk_token": None,
        "continuing_subword_prefix": None,
        "end_of_word_suffix": None,
        "fuse_unk": False,
        "byte_fallback": False,
        "ignore_merges": False,
        "vocab": {symbol: byte for byte, symbol in enumerate(_byte_symbols())},
        "merges": [],
    }
    return write_hf_tokenizer(
        directory,
        pre_tokenizer=byte_level,
        model=model,
        decoder=byte_level,
        config={"chat_template": CHAT_TEMPLATE},
    )
