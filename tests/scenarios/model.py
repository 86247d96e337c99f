"""What a scenario is (shape, fault, workload; all from one seed) and what a run
records (every client's outcome, the EPPs' and servers' counters)."""

from __future__ import annotations

from dataclasses import dataclass, field

# deployment shapes this step covers (docs/testing.md)
SHAPES = ("plain", "lora-subset", "workers-2", "stack-replicas", "pd-nixl")
# faults: none, a server SIGKILLed or SIGSTOPped while streams run on it (or at once,
# whatever it is doing: the requests it was sent meanwhile meet it before their first
# byte), a server
# answering a share of requests with an error status, a server's /metrics failing or
# slow, an EPP replica SIGKILLed
FAULTS = (
    "none",
    "sigkill-mid-stream",
    "sigstop-mid-stream",
    "sigkill-at-once",
    "sigstop-at-once",
    "fault-status",
    "metrics-fault",
    "epp-replica-kill",
)
BASE_MODEL = "sim-model"
ADAPTER = "ad-1"  # preloaded on the first two servers of the lora-subset shape

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
    adapter_share: float  # requests for ADAPTER (lora-subset only)
    max_tokens: tuple[int, int]


@dataclass(frozen=True)
class Scenario:
    seed: int
    shape: str
    fault: Fault
    workload: Workload

    def describe(self) -> str:
        f, w = self.fault, self.workload
        return (
            f"seed {self.seed}: shape {self.shape}, fault {f.kind} (target {f.target}, after "
            f"{f.after}{''.join(', ' + x for x in (f.statuses, f.metrics) if x)}), "
            f"{w.requests} requests by "
            f"{w.clients} clients (stream {w.stream_share:.0%}, hang-up {w.hangup_share:.0%}, "
            f"220 KB {w.big_share:.0%}, adapter {w.adapter_share:.0%})"
        )

    def replay(self) -> str:
        return f".venv/bin/python -m tests.scenarios.replay {self.seed}"


@dataclass(frozen=True)
class RequestSpec:
    index: int
    body: bytes
    model: str
    stream: bool
    hangup: bool  # the client closes the connection early (drive.send)


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
    epp_restarted: bool = False  # an EPP process died: its counters restarted from 0
    # after the load: requests sent one at a time until the fault's victim served one
    # (I6); empty where the fault has no server victim
    recovery: list[Outcome] = field(default_factory=list)
    recovery_error: str = ""  # the victim never came back into the pool
