"""What a request's ``model`` names, decided before it is scheduled: rewrites with
traffic splits, and the LoRA adapter catalogue.

* **Rewrite** (as the llm-d Router's InferenceModelRewrite): the ``x-llm-d-model-name-
  rewrite`` header (older alias ``x-gateway-model-name-rewrite``) names the model to
  send upstream; else ``models.rewrites`` maps a client-facing name to targets with
  weights, one picked per request in proportion to its weight (canaries, A/B tests
  between adapters). The body's ``model`` is rewritten to the target.
* **Catalogue**: a (rewritten) model in ``models.adapters`` is an adapter request,
  routed by LoRA affinity (epp.scheduling.plugins.lora) and, with placement on, loaded
  where none has it (epp.lora.placement). With ``models.baseModels`` also set, a model in
  neither list is answered 404, naming it.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from epp.common.sections import setting, setting_factory
from epp.errors import ModelNotFoundError
from epp.types import InferenceRequest

# the llm-d Router's header first, then the Inference Extension's older name
REWRITE_HEADERS = ("x-llm-d-model-name-rewrite", "x-gateway-model-name-rewrite")


@dataclass(frozen=True)
class ModelsConfig:
    """Model names: rewrites with traffic splits, and the LoRA adapter catalogue."""

    rewrites: Mapping[str, Mapping[str, int]] = setting_factory(
        dict,
        "rewrites",
        "client-facing model -> {target model or adapter: weight}; each request goes to "
        "one target, picked in proportion to the weights",
    )
    adapters: Mapping[str, str] = setting_factory(
        dict,
        "adapters",
        "LoRA adapter catalogue: name -> the path a server loads it from (lora_path)",
    )
    base_models: tuple[str, ...] = setting(
        (),
        "baseModels",
        "models that are not adapters; with adapters and this set, any other model is a 404",
    )


@dataclass(frozen=True, slots=True)
class Resolved:
    """A request with its model resolved; ``doc`` is the body to send when rewritten
    (None: the body goes as it came)."""

    request: InferenceRequest
    doc: dict[str, Any] | None = None


def resolve(
    cfg: ModelsConfig,
    request: InferenceRequest,
    doc: Mapping[str, Any] | None,
    rng: random.Random,
) -> Resolved:
    """``request`` with its model rewritten (header, else ``rewrites``) and flagged when it
    names a catalogued adapter; ModelNotFoundError for a model nobody knows (only with
    both ``adapters`` and ``baseModels`` set). A request naming no model (``""``: an
    engine's generate API, whose server serves one) is left as it is."""
    model = request.model
    if not model or doc is None:  # no body, or one naming no model (generate APIs)
        return Resolved(request)
    target = _target(cfg, request.headers, model, rng)
    flagged = target in cfg.adapters
    if not flagged and cfg.adapters and cfg.base_models and target not in cfg.base_models:
        raise ModelNotFoundError(
            f"model {target!r} is neither a base model nor a LoRA adapter this gateway knows "
            f"(models.baseModels, models.adapters)",
            code="model_not_found",
        )
    if target == model:
        return Resolved(replace(request, lora_adapter=flagged) if flagged else request)
    return Resolved(replace(request, model=target, lora_adapter=flagged), {**doc, "model": target})


def _target(cfg: ModelsConfig, headers: Mapping[str, str], model: str, rng: random.Random) -> str:
    for name in REWRITE_HEADERS:
        value = headers.get(name, "").strip()
        if value:
            return value
    targets = cfg.rewrites.get(model)
    if not targets:
        return model
    names = list(targets)
    return rng.choices(names, weights=[targets[n] for n in names])[0]
