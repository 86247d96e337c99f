"""A scenario and its requests from a seed: every choice comes from
``random.Random(seed)``, so a seed names one scenario exactly. Each choice takes one
``random()`` whatever it chooses among, so pinning the shape and the fault (the fast
tier does) leaves the rest of a seed's draws as they were."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace
from typing import TypeVar

import orjson

from tests.scenarios.model import (
    ADAPTER,
    ADAPTERS,
    ALIAS,
    BASE_MODEL,
    CHAT_PATH,
    COMPLETIONS_PATH,
    FAULTS,
    PRIORITY_HEADER,
    REWRITE_HEADER,
    SERVER_FAULTS,
    SHAPES,
    Fault,
    RequestSpec,
    Scenario,
    Workload,
)

T = TypeVar("T")

BIG_PROMPT_BYTES = 220 * 1024
# the shapes whose requests send a share of their prompts as token ids: where the
# servers count a token per byte (KV events: the simulators' byte tokenizer), so a
# token-id prompt's size is not what its text spelling (4 characters an id) makes of it
# (I7). Their streams ask for usage (stream_options.include_usage), so every answer
# tells the EPP its prompt's tokens, and their 220 KB prompts are sent as ids: as text,
# a few would take the EPP's learned characters per token past its window (a million
# tokens, then its sums are halved), after which I7 could not say what it should hold
TOKEN_ID_SHAPES = ("kv-events",)
TOKEN_ID_SHARE = 0.5
# a 220 KB prompt as ids: its first bytes' ids, as many as make a body of about 220 KB
BIG_PROMPT_IDS = 62_000
# conversations (Workload.session_share): how many run through a scenario's requests;
# not in the TOKEN_ID_SHAPES, whose I7 judges text prompts a token per character
SESSIONS = 3
STATUS_MIXES = ("503:0.3", "500:0.2,429:0.1", "404:0.2", "503:0.1,404:0.1,429:0.1")

PD = ("pd-nixl", "pd-sidecar", "pd-concurrent", "pd-kv-pool", "pd-deferred")
# shapes started by LocalStack in this process (deploy.InProcess): Envoy restart, a
# server replaced on a new port and the admin API apply to them
IN_PROCESS = tuple(s for s in SHAPES if s != "stack-replicas")


def _faults_of(shape: str) -> tuple[str, ...]:
    """The faults a shape can take: an EPP replica to kill needs replicas (or, failing
    open, the one EPP), a worker needs workers, a KV-event publisher the kv-events shape;
    a server is replaced on a new port or removed and added back through the admin API
    where its flags are the stack's plain ones (not a P/D leg, not a publisher)."""
    out = ["none", *SERVER_FAULTS]
    if shape in ("stack-replicas", "replicas", "fail-open"):
        out.append("epp-replica-kill")
    if shape == "workers-2":
        out.append("epp-worker-kill")
    if shape in IN_PROCESS:
        out.append("envoy-restart")
        if shape not in PD and shape != "kv-events":
            out += ["restart-new-port", "admin-remove-add"]
    if shape == "kv-events":
        out.append("kv-publisher-restart")
    return tuple(f for f in FAULTS if f in out)


FAULTS_OF = {shape: _faults_of(shape) for shape in SHAPES}
# what a request of each shape may ask for: (model, headers) with their weights
ASKS: dict[str, tuple[tuple[str, tuple[tuple[str, str], ...]], ...]] = {
    "lora-subset": ((ADAPTER, ()), (BASE_MODEL, ())),
    "lora-registered": ((ADAPTERS[0], ()), (ADAPTERS[1], ()), (BASE_MODEL, ())),
    "lora-on-demand": ((ADAPTERS[0], ()), (ADAPTERS[1], ()), (BASE_MODEL, ())),
    "model-rewrite": (
        (ALIAS, ()),
        ("anything", ((REWRITE_HEADER, ADAPTER),)),
        (BASE_MODEL, ()),
    ),
    "flow-control": tuple((BASE_MODEL, ((PRIORITY_HEADER, p),)) for p in ("1", "0", "-1")),
}
ASKS["flow-control-off"] = ASKS["flow-control"]


def _pick(rng: random.Random, choices: Sequence[T]) -> T:
    """One of ``choices`` for exactly one ``rng.random()``."""
    return choices[int(rng.random() * len(choices))]


# a short scenario (the fast tier): at most this many requests, its fault striking and
# healing within a few answers; drawn as the long one, then cut
SHORT_REQUESTS, SHORT_AFTER, SHORT_HEAL = 24, 6, 8


def scenario(
    seed: int, shape: str | None = None, fault: str | None = None, short: bool = False
) -> Scenario:
    """The scenario of ``seed`` (``shape``/``fault``: pin them instead of drawing;
    ``short``: cut to SHORT_REQUESTS requests)."""
    rng = random.Random(seed)
    drawn = _pick(rng, SHAPES)
    shape = shape or drawn
    drawn_fault = _pick(rng, FAULTS_OF[shape])
    kind = fault or drawn_fault
    if kind not in FAULTS_OF[shape]:
        raise ValueError(f"shape {shape} cannot take fault {kind}: {', '.join(FAULTS_OF[shape])}")
    requests = rng.randrange(40, 90)
    workload = Workload(
        requests=min(requests, SHORT_REQUESTS) if short else requests,
        clients=rng.randrange(3, 7),
        stream_share=_pick(rng, (0.3, 0.5, 0.8)),
        hangup_share=_pick(rng, (0.0, 0.0, 0.1)),
        big_share=_pick(rng, (0.0, 0.05, 0.1)),
        adapter_share=0.5 if shape in ASKS else 0.0,
        max_tokens=(8, _pick(rng, (24, 48))),
        # by the shape, not drawn: every other seed's draws stay as they were
        token_id_share=TOKEN_ID_SHARE if shape in TOKEN_ID_SHAPES else 0.0,
    )
    decoders = 2 if shape in PD else 3
    after = rng.randrange(5, max(6, requests // 3))
    target = rng.random()
    heal_after = rng.randrange(15, 35)
    if short:
        after, heal_after = min(after, SHORT_AFTER), min(heal_after, SHORT_HEAL)
    # drawn after everything above, so every earlier draw of a seed stays as it was;
    # a short scenario (the fast tier, the recorded --short replays) has neither
    session_share = _pick(rng, (0.0, 0.3, 0.6))
    burst = _pick(rng, (0, 0, 8, 16))
    burst_at = rng.randrange(0, requests)
    if not short and burst and burst_at + burst <= requests:
        workload = replace(workload, burst=burst, burst_at=burst_at)
    if not short and shape not in TOKEN_ID_SHAPES:
        workload = replace(workload, session_share=session_share)
    return Scenario(
        seed=seed,
        shape=shape,
        fault=Fault(
            kind=kind,
            target=int(target * (2 if kind == "epp-replica-kill" else decoders)),
            after=after,
            statuses=_pick(rng, STATUS_MIXES) if kind == "fault-status" else "",
            metrics=_pick(rng, ("fail", "slow:3")) if kind == "metrics-fault" else "",
            heal_after=heal_after,
        ),
        workload=workload,
        pinned=shape != drawn or kind != drawn_fault,
        short=short,
    )


def requests(s: Scenario) -> list[RequestSpec]:
    """The scenario's requests, in the order the clients take them. Which prompts are
    token ids comes from a generator of its own, so the other draws stay as they were
    (a token-id prompt is the byte ids of the text prompt drawn for it)."""
    rng = random.Random(f"requests-{s.seed}")
    as_ids = random.Random(f"token-ids-{s.seed}")
    as_turn = random.Random(f"sessions-{s.seed}")
    turns = [0] * SESSIONS  # each conversation's turns so far
    w = s.workload
    asks = ASKS.get(s.shape, ((BASE_MODEL, ()),))
    specs = []
    for i in range(w.requests):
        stream = rng.random() < w.stream_share
        model, headers = _pick(rng, asks) if rng.random() < w.adapter_share else (BASE_MODEL, ())
        ids = as_ids.random() < w.token_id_share
        big = rng.random() < w.big_share
        if big:
            prompt = (f"Request {i} carries a long document. " * 8000)[:BIG_PROMPT_BYTES]
            ids, prompt = (True, prompt[:BIG_PROMPT_IDS]) if w.token_id_share else (ids, prompt)
        else:
            prompt = f"Scenario {s.seed} request {i}: " + "tell me more. " * rng.randrange(1, 40)
        token_ids = list(prompt.encode()) if ids else []
        session = int(as_turn.random() * SESSIONS) if as_turn.random() < w.session_share else -1
        doc: dict[str, object] = {"model": model}
        if session >= 0 and not big:
            doc["messages"] = conversation(s.seed, session, turns[session])
            turns[session] += 1
        else:
            session = -1
            doc["prompt"] = token_ids or prompt
        doc["max_tokens"] = rng.randrange(*w.max_tokens)
        if stream:
            doc["stream"] = True
            if w.token_id_share:  # every answer tells its prompt's tokens (I7)
                doc["stream_options"] = {"include_usage": True}
        hangup = rng.random() < w.hangup_share
        path = CHAT_PATH if session >= 0 else COMPLETIONS_PATH
        body = orjson.dumps(doc)
        specs.append(RequestSpec(
            i, body, model, stream, hangup, headers, len(token_ids), path, session
        ))  # fmt: skip
    return specs


def conversation(seed: int, session: int, turn: int) -> list[dict[str, str]]:
    """Turn ``turn`` of conversation ``session``: its system message, the turns before
    it (each question with a made-up answer) and its own question, so that its prompt
    extends the previous turn's (a few whole KV blocks of shared prefix and more)."""
    messages = [{"role": "system", "content": f"Conversation {session} of scenario {seed}. "
                 + "You answer questions about the request path, one at a time. " * 8}]  # fmt: skip
    for k in range(turn + 1):
        ask = f"Question {k}: " + "what happens to a request after that? " * (1 + k % 3)
        messages.append({"role": "user", "content": ask})
        if k < turn:
            answer = f"Answer {k}: " + "it goes on to the next step of the path. " * 3
            messages.append({"role": "assistant", "content": answer})
    return messages
