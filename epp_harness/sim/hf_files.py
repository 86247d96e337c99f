"""Writes a tokenizer as the Hugging Face files a client or the EPP loads:
``tokenizer.json`` (read by the ``tokenizers`` library) and ``tokenizer_config.json``
(its chat template, read by jinja2 or ``transformers``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_hf_tokenizer(
    directory: Path,
    *,
    pre_tokenizer: dict[str, Any],
    model: dict[str, Any],
    decoder: dict[str, Any],
    config: dict[str, Any],
) -> Path:
    """Write a tokenizer without normalizer, added tokens or post-processor, and
    ``config`` (with ``tokenizer_class`` PreTrainedTokenizerFast) into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer: dict[str, Any] = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": None,
        "decoder": decoder,
        "model": model,
    }
    (directory / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False))
    config = {**config, "tokenizer_class": "PreTrainedTokenizerFast"}
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    return directory
