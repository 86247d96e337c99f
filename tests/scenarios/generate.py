"""A scenario and its requests from a seed: every choice comes from
``random.Random(seed)``, so a seed names one scenario exactly."""

from __future__ import annotations

import random

import orjson

from tests.scenarios.model import (
    ADAPTER,
    BASE_MODEL,
    FAULTS,
    SHAPES,
    Fault,
    RequestSpec,
    Scenario,
    Workload,
)

BIG_PROMPT_BYTES = 220 * 1024
# faults each shape can take (an EPP replica to kill needs replicas)
FAULTS_OF = {shape: tuple(f for f in FAULTS if f != "epp-replica-kill") for shape in SHAPES}
FAULTS_OF["stack-replicas"] = FAULTS
STATUS_MIXES = ("503:0.3", "500:0.2,429:0.1", "404:0.2", "503:0.1,404:0.1,429:0.1")


def scenario(seed: int, shape: str | None = None, fault: str | None = None) -> Scenario:
    """The scenario of ``seed`` (``shape``/``fault``: pin them instead of drawing)."""
    rng = random.Random(seed)
    shape = shape or rng.choice(SHAPES)
    kind = fault or rng.choice(FAULTS_OF[shape])
    requests = rng.randrange(40, 90)
    workload = Workload(
        requests=requests,
        clients=rng.randrange(3, 7),
        stream_share=rng.choice((0.3, 0.5, 0.8)),
        hangup_share=rng.choice((0.0, 0.0, 0.1)),
        big_share=rng.choice((0.0, 0.05, 0.1)),
        adapter_share=0.5 if shape == "lora-subset" else 0.0,
        max_tokens=(8, rng.choice((24, 48))),
    )
    decoders = 2 if shape == "pd-nixl" else 3
    after = rng.randrange(5, max(6, requests // 3))
    return Scenario(
        seed=seed,
        shape=shape,
        fault=Fault(
            kind=kind,
            target=rng.randrange(2 if kind == "epp-replica-kill" else decoders),
            after=after,
            statuses=rng.choice(STATUS_MIXES) if kind == "fault-status" else "",
            metrics=rng.choice(("fail", "slow:3")) if kind == "metrics-fault" else "",
            heal_after=rng.randrange(15, 35),
        ),
        workload=workload,
    )


def requests(s: Scenario) -> list[RequestSpec]:
    """The scenario's requests, in the order the clients take them."""
    rng = random.Random(f"requests-{s.seed}")
    w = s.workload
    specs = []
    for i in range(w.requests):
        stream = rng.random() < w.stream_share
        model = ADAPTER if rng.random() < w.adapter_share else BASE_MODEL
        if rng.random() < w.big_share:
            prompt = (f"Request {i} carries a long document. " * 8000)[:BIG_PROMPT_BYTES]
        else:
            prompt = f"Scenario {s.seed} request {i}: " + "tell me more. " * rng.randrange(1, 40)
        doc: dict[str, object] = {
            "model": model,
            "prompt": prompt,
            "max_tokens": rng.randrange(*w.max_tokens),
        }
        if stream:
            doc["stream"] = True
        hangup = rng.random() < w.hangup_share
        specs.append(RequestSpec(i, orjson.dumps(doc), model, stream, hangup))
    return specs
