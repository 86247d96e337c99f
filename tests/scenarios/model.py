"""What a scenario is (shape, fault, workload; all from one seed) and what a run
records (every client's outcome, the EPPs' and servers' counters)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# deployment shapes (docs/testing.md has what each runs)
SHAPES = (
    "plain",
    "lora-subset",  # an adapter preloaded on two of three servers
    "lora-registered",  # adapters registered on every server, one slot each
    "lora-on-demand",  # adapters loaded by the EPP where it routes them (placement)
    "model-rewrite",  # client-facing names rewritten to adapters (config and header)
    "workers-2",
    "stack-replicas",  # `epp stack --replicas 2`
    "replicas",  # two `epp serve` side by side, started by LocalStack
    "pd-nixl",
    "pd-sidecar",
    "pd-concurrent",
    "pd-kv-pool",
    "pd-deferred",  # nixl, the decode pick deferred to the prefill leg's end
    "kv-events",  # the precise prefix scorer fed by the servers' KV events
    "flow-control",  # on, one request per server: the others wait in the EPP, by priority
    "flow-control-off",  # the same pool saturated without it: sheddable requests shed
    "tls",  # Envoy talks TLS to the EPP
    "fail-open",  # Envoy routes round robin while the EPP is down
)
# faults: none, a server SIGKILLed or SIGSTOPped while streams run on it (or at once,
# whatever it is doing: the requests it was sent meanwhile meet it before their first
# byte), a server answering a share of requests with an error status, a server's
# /metrics failing or slow, a server stopped and started again on its port or replaced
# by one on a new port (the admin API told), a server removed through the admin API
# under traffic and added back, an EPP replica or worker SIGKILLed, Envoy restarted on
# its port, a KV-event publisher (a server of the kv-events shape) SIGKILLed and
# started again
# the faults on one server that any shape can take (generate.FAULTS_OF adds the rest)
SERVER_FAULTS = (
    "sigkill-mid-stream",
    "sigstop-mid-stream",
    "sigkill-at-once",
    "sigstop-at-once",
    "fault-status",
    "metrics-fault",
    "restart-same-port",
)
FAULTS = (  # the order is the generator's: a seed's draw depends on it
    "none",
    *SERVER_FAULTS,
    "restart-new-port",
    "admin-remove-add",
    "epp-replica-kill",
    "epp-worker-kill",
    "envoy-restart",
    "kv-publisher-restart",
)
BASE_MODEL = "sim-model"
ADAPTER = "ad-1"  # preloaded on the first two servers of the lora-subset shape
ADAPTERS = (ADAPTER, "ad-2")  # the catalogue of lora-registered and lora-on-demand
ALIAS = "alias"  # model-rewrite: rewritten by the config to ADAPTER or BASE_MODEL
REWRITES = {ALIAS: (ADAPTER, BASE_MODEL)}  # model-rewrite's models.rewrites, even weights
COMPLETIONS_PATH = "/v1/completions"
CHAT_PATH = "/v1/chat/completions"
PRIORITY_HEADER = "x-gateway-inference-priority"
REWRITE_HEADER = "x-llm-d-model-name-rewrite"

_MODEL_FIELD = re.compile(rb'"model":\s*"([^"]+)"')

# per-attempt silence allowed from a server (Envoy's first-byte and stream-idle timeouts)
# and the EPP's stream chunk timeout in every scenario: short, so a frozen server costs
# seconds; the budgets in docs/timeouts.md are built from them
IDLE_S = 4.0
# where a server freezes mid-stream, streams get three times as long for their first byte
# (production's relation: 60 s before the first byte, 15 s between chunks), so a stream
# held for its first-byte budget is told apart from one ended at its chunk budget (I4)
FROZEN_MID_STREAM_FIRST_BYTE_S = 3 * IDLE_S


def stream_first_byte_s(fault: str) -> float:
    """Envoy's per-try idle timeout for streams (their first-byte budget) under
    ``fault``; IDLE_S elsewhere, so a server frozen before its first byte costs seconds."""
    return FROZEN_MID_STREAM_FIRST_BYTE_S if fault == "sigstop-mid-stream" else IDLE_S


@dataclass(frozen=True)
class Fault:
    kind: str
    target: int = 0  # the server (index among the servers that decode) or EPP replica
    after: int = 0  # strikes once this many requests have been answered
    statuses: str = ""  # fault-status: the sim's --fault-status spec
    metrics: str = ""  # metrics-fault: the sim's --fault-metrics spec
    heal_after: int = 0  # fault-status, metrics-fault, sigstop: healed this many answers on


@dataclass(frozen=True)
class Workload:
    requests: int
    clients: int  # concurrent client threads
    stream_share: float
    hangup_share: float  # requests the client walks away from (a stream after its first
    # chunk, a non-streaming request once sent)
    big_share: float  # 220 KB prompts
    # requests that ask for something else than the base model (generate.ASKS: an
    # adapter, a name to rewrite, a priority), in the shapes that have such asks
    adapter_share: float
    max_tokens: tuple[int, int]
    # requests whose prompt is token ids (the servers' own ids: a client that tokenizes
    # for itself), in the shapes that send them (generate.TOKEN_ID_SHAPES)
    token_id_share: float = 0.0
    # requests that are turns of a few conversations (chat completions whose messages
    # repeat the conversation so far, so each turn's prompt extends the last one's)
    session_share: float = 0.0
    # a burst: this many requests sent at once when a client reaches request burst_at,
    # beside the other clients (0: none)
    burst: int = 0
    burst_at: int = 0


@dataclass(frozen=True)
class Scenario:
    seed: int
    shape: str
    fault: Fault
    workload: Workload
    # whether shape and fault were pinned rather than drawn (the fast tier pins them, so
    # its scenarios stay what they are when the lists above grow)
    pinned: bool = False
    short: bool = False  # cut short (generate.SHORT_REQUESTS)

    def describe(self) -> str:
        f, w = self.fault, self.workload
        return (
            f"seed {self.seed}: shape {self.shape}, fault {f.kind} (target {f.target}, after "
            f"{f.after}{''.join(', ' + x for x in (f.statuses, f.metrics) if x)}), "
            f"{w.requests} requests by "
            f"{w.clients} clients (stream {w.stream_share:.0%}, hang-up {w.hangup_share:.0%}, "
            f"220 KB {w.big_share:.0%}, other models or headers {w.adapter_share:.0%}"
            # said only where there are some, so other shapes' descriptions stay as checked
            + (f", token ids {w.token_id_share:.0%}" if w.token_id_share else "")
            + (f", conversations {w.session_share:.0%}" if w.session_share else "")
            + (f", a burst of {w.burst} at request {w.burst_at}" if w.burst else "")
            + ")"
        )

    def replay(self) -> str:
        pins = f" --shape {self.shape} --fault {self.fault.kind}" if self.pinned else ""
        short = " --short" if self.short else ""
        return f".venv/bin/python -m tests.scenarios.replay {self.seed}{pins}{short}"


@dataclass(frozen=True)
class RequestSpec:
    index: int
    body: bytes
    model: str
    stream: bool
    hangup: bool  # the client closes the connection early (drive.send)
    headers: tuple[tuple[str, str], ...] = ()  # priority, model rewrite
    token_ids: int = 0  # a prompt of this many token ids (0: a text prompt)
    path: str = COMPLETIONS_PATH  # CHAT_PATH for a conversation's turn
    session: int = -1  # the conversation it is a turn of (-1: none)

    @property
    def priority(self) -> int:
        return next((int(v) for k, v in self.headers if k == PRIORITY_HEADER), 0)


@dataclass
class Outcome:
    spec: RequestSpec
    started: float  # time.monotonic()
    status: int = 0  # 0: no response headers (connection failed or reset before them)
    served: str = ""  # x-sim-instance
    body: bytes = b""
    first_byte_s: float | None = None  # after ``started``
    # the longest silence after the first body byte: between two chunks, or from the last
    # chunk to the end (a cut included)
    longest_gap_s: float = 0.0
    seconds: float = 0.0
    error: str = ""  # the client-side exception, if any
    hung_up: bool = False  # the client walked away on purpose
    dropped: str = ""  # x-llm-d-request-dropped-reason: why the EPP refused it

    @property
    def answered_model(self) -> str:
        """The model the server answered as (the body's first "model"; a rewritten
        request's target), else the one asked for."""
        found = _MODEL_FIELD.search(self.body)
        return found.group(1).decode() if found else self.spec.model

    @property
    def served_as(self) -> frozenset[str]:
        """What the server may have served it as: the model its answer names; for an
        answer cut before it named one, the model asked for or, where the config or a
        header rewrites that name, whatever it may become."""
        if _MODEL_FIELD.search(self.body):
            return frozenset({self.answered_model})
        header = next((v for k, v in self.spec.headers if k == REWRITE_HEADER), None)
        if header is not None:
            return frozenset({header})
        return frozenset(REWRITES.get(self.spec.model, (self.spec.model,)))

    @property
    def complete(self) -> bool:
        if self.status != 200:
            return False
        if self.spec.stream:
            return self.body.rstrip().endswith(b"data: [DONE]")
        return b'"choices"' in self.body

    @property
    def injected(self) -> bool:
        """An error the simulator injected (--fault-status), not a real one."""
        return self.status >= 400 and b"injected fault" in self.body


@dataclass
class FaultEvent:
    what: str
    at: float  # time.monotonic()
    until: float | None = None  # when it was healed (SIGCONT, statuses cleared)
    victim: str = ""  # the server's address or the replica's name
    # the server that must serve again after it heals (I6): the victim, or the server
    # that replaced it on a new port
    rejoin: str = ""


@dataclass
class Run:
    """Everything a run recorded, for the invariant checks."""

    scenario: Scenario
    outcomes: list[Outcome]
    events: list[FaultEvent]
    # what each server (address) serves: the base model and its adapters
    serves: dict[str, set[str]]
    servers_that_decode: list[str]
    # every EPP HTTP port's counters after quiescing (sample name with labels -> value),
    # and the same before the load
    epp_before: list[dict[str, float]] = field(default_factory=list)
    epp_after: list[dict[str, float]] = field(default_factory=list)
    quiesce_error: str = ""  # what did not return to rest (I3), if anything
    sockets_error: str = ""  # EPP sockets that did not return to their baseline (I3)
    epp_restarted: bool = False  # an EPP process died: its counters restarted from 0
    # ext_proc streams Envoy opened again on another EPP during the load (its
    # cluster.epp.upstream_rq_retry): each may have been routed by both (I5)
    epp_stream_retries: float = 0.0
    # after the load: requests sent one at a time until the fault's victim served one
    # (I6); empty where the fault has no server victim
    recovery: list[Outcome] = field(default_factory=list)
    recovery_error: str = ""  # the victim never came back into the pool
    # then a new conversation a turn at a time (I6's placement: run.settle)
    placement: list[Outcome] = field(default_factory=list)
