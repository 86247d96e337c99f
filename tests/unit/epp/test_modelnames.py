"""Model names before scheduling: header and config rewrites with weights, the adapter
catalogue's flag, and the 404 for a model nobody serves; the config shapes they read."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from epp import config
from epp.common.params import ConfigError
from epp.errors import ModelNotFoundError
from epp.modelnames import ModelsConfig, resolve
from epp.types import InferenceRequest


def req(model: str, **headers: str) -> InferenceRequest:
    return InferenceRequest("r", model, "/v1/completions", headers=headers)


DOC = {"model": "chat", "prompt": "hi"}


def test_weights_split_traffic_and_rewrite_the_body() -> None:
    cfg = ModelsConfig(rewrites={"chat": {"v1": 90, "v2": 10, "off": 0}})
    rng = random.Random(1)
    seen: Counter[str] = Counter()
    for _ in range(2000):
        out = resolve(cfg, req("chat"), DOC, rng)
        assert out.doc is not None and out.doc["model"] == out.request.model
        assert out.doc["prompt"] == "hi"
        seen[out.request.model or ""] += 1
    assert set(seen) == {"v1", "v2"} and 0.85 < seen["v1"] / 2000 < 0.95


def test_the_header_wins_and_an_unmapped_model_is_left_alone() -> None:
    cfg = ModelsConfig(rewrites={"chat": {"v1": 1}}, adapters={"sql": "/a/sql"})
    rng = random.Random(0)
    out = resolve(cfg, req("chat", **{"x-llm-d-model-name-rewrite": "sql"}), DOC, rng)
    assert out.request.model == "sql" and out.request.lora_adapter and out.doc is not None
    out = resolve(cfg, req("chat", **{"x-gateway-model-name-rewrite": "v9"}), DOC, rng)
    assert out.request.model == "v9" and not out.request.lora_adapter
    plain = req("base")
    assert resolve(cfg, plain, DOC, rng).request is plain
    assert resolve(cfg, plain, DOC, rng).doc is None
    flagged = resolve(cfg, req("sql"), DOC, rng)
    assert flagged.request.lora_adapter and flagged.doc is None  # no rewrite: body as sent


def test_a_model_nobody_serves_is_a_404_naming_it_only_with_both_lists() -> None:
    rng = random.Random(0)
    both = ModelsConfig(adapters={"sql": "/a"}, base_models=("base",))
    with pytest.raises(ModelNotFoundError) as err:
        resolve(both, req("nope"), DOC, rng)
    assert err.value.status == 404 and "'nope'" in err.value.message
    assert err.value.code == "model_not_found"
    assert resolve(both, req("base"), DOC, rng).request.model == "base"
    only_adapters = ModelsConfig(adapters={"sql": "/a"})
    assert resolve(only_adapters, req("nope"), DOC, rng).request.model == "nope"
    # a generate API's body names no model: the server's own, never a 404
    unnamed = resolve(both, req(""), {"token_ids": [1]}, rng)
    assert unnamed.request.model == "" and unnamed.doc is None


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("models: {rewrites: {chat: {}}}", "non-empty map"),
        ("models: {rewrites: {chat: {v1: -1}}}", "integer weight"),
        ("models: {rewrites: {chat: {v1: 0}}}", "at least one weight"),
        ("models: {rewrites: [1]}", "expected name ->"),
        ("models: {adapters: {sql: 1}}", "string->string"),
        ("models: {baseModels: base}", "list of strings"),
        ("loraPlacement: {maxAdaptersPerServer: 0}", "maxAdaptersPerServer"),
    ],
)
def test_bad_sections_name_the_key(text: str, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        config.load_text(text, "f")


def test_sections_read_back_as_shown() -> None:
    cfg = config.load_text(
        "models: {rewrites: {chat: {v1: 3, v2: 1}}, adapters: {sql: /a/sql}, "
        "baseModels: [base]}\nloraPlacement: {enabled: true}",
        "f",
    )
    assert cfg.models.rewrites == {"chat": {"v1": 3, "v2": 1}}
    assert cfg.models.adapters == {"sql": "/a/sql"} and cfg.models.base_models == ("base",)
    assert cfg.lora_placement.enabled and not cfg.lora_placement.unload_lru
    shown = config.effective_yaml(cfg)
    assert config.effective_yaml(config.load_text(shown, "f")) == shown
