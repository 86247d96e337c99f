"""Plain data shared by the scheduler, the datastore and the Envoy adapter."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

# characters per token before the servers' usage reports teach the real figure (English
# text with a BPE tokenizer is about 4)
CHARS_PER_TOKEN = 4.0


class Role(StrEnum):
    """What an endpoint serves in a prefill/decode split (unlabelled endpoints decode)."""

    DECODE = "decode"
    PREFILL = "prefill"
    BOTH = "prefill-decode"

    @classmethod
    def parse(cls, value: str) -> Role:
        """A role from its name; ``both`` is accepted for ``prefill-decode`` (llm-d's
        deprecated spelling). Raises ValueError naming the accepted values."""
        name = value.strip().lower()
        if name == "both":
            return cls.BOTH
        try:
            return cls(name)
        except ValueError:
            accepted = ", ".join([r.value for r in cls] + ["both"])
            raise ValueError(f"unknown role {value!r}; use one of: {accepted}") from None


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One model-server port: the unit the EPP routes to."""

    host: str
    port: int
    role: Role = Role.DECODE
    labels: Mapping[str, str] = field(default_factory=dict, hash=False)
    # Which model-server engine serves here: picks the metric names to scrape
    # ("vllm", "sglang", "trtllm"; see epp.datalayer).
    engine: str = "vllm"
    # ``name:port`` when the user named this server by a host name that was resolved to
    # ``host`` (shown in /status, kept in the state file, re-resolved); "" otherwise
    name: str = field(default="", compare=False)
    # ``ip:port``, the value Envoy routes by (IPv6 hosts bracketed); derived once, as
    # the scheduler reads it for every candidate of every request.
    address: str = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        host = f"[{self.host}]" if ":" in self.host else self.host
        object.__setattr__(self, "address", f"{host}:{self.port}")


@dataclass(frozen=True, slots=True)
class EndpointMetrics:
    """Load an endpoint reported about itself (Prometheus scrape or ORCA report).

    ``None`` means "not reported", never zero. ``updated_at`` is the monotonic time of
    the newest report; the scheduler treats metrics older than its staleness bound as
    unknown load.
    """

    updated_at: float
    waiting: float | None = None  # requests queued in the engine
    running: float | None = None  # requests in the running batch
    kv_usage: float | None = None  # KV-cache utilisation, 0..1
    lora_running: frozenset[str] = frozenset()
    lora_waiting: frozenset[str] = frozenset()
    max_lora: int | None = None
    block_size: int | None = None  # tokens per KV block (cache_config_info)
    num_blocks: int | None = None  # KV blocks on the device (cache_config_info)
    # prefix-cache counters since the engine started, in prompt tokens: looked up, found
    prefix_cache_queries: float | None = None
    prefix_cache_hits: float | None = None
    # when the server process started (unix seconds): a new value means it restarted,
    # and lost what it held in memory (its runtime-loaded LoRA adapters)
    started_at: float | None = None
    # ORCA values by their report key: "cpu_utilization", "named_metrics.<n>",
    # "utilization.<n>", "request_cost.<n>", ...
    orca: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class EndpointState:
    """An endpoint plus the slow-changing state the EPP knows about it (replaced, never
    mutated, when it changes)."""

    endpoint: Endpoint
    metrics: EndpointMetrics | None = None
    address: str = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "address", self.endpoint.address)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The pool as the scheduler sees it.

    ``endpoints`` is an immutable tuple rebuilt only when membership or endpoint state
    changes. ``in_flight`` (address -> requests the EPP has routed there and not seen
    finish, its peers' included when they share their load: docs/replicas.md) and
    ``in_flight_tokens`` (their estimated prompt + output tokens) change on
    every request, so they are read-only views of the live counters rather than copies:
    scheduling is synchronous on the event loop, so the views cannot change during one
    scheduling call. Tests pass plain dicts.
    """

    endpoints: tuple[EndpointState, ...]
    in_flight: Mapping[str, int]
    in_flight_tokens: Mapping[str, int] = field(default_factory=dict)
    version: int = 0
    # address -> state for lookups (a live view in the datastore, like in_flight)
    by_address: Mapping[str, EndpointState] = field(default_factory=dict)
    # what plugins derive from ``endpoints`` alone (e.g. metric columns), computed on
    # first use and kept as long as this snapshot: never the live in-flight counts
    derived: dict[Any, Any] = field(default_factory=dict, compare=False, repr=False)

    def state(self, address: str) -> EndpointState | None:
        found = self.by_address.get(address)
        if found is None:  # no live index (tests, benchmarks): index endpoints once
            index = self.derived.get("by_address")
            if index is None:
                index = self.derived["by_address"] = {}
                for s in self.endpoints:
                    index.setdefault(s.address, s)
            found = index.get(address)
        return found


@dataclass(frozen=True, slots=True)
class InferenceRequest:
    """What the scheduler needs to know about one request (parsed once, never re-read)."""

    request_id: str
    model: str | None
    path: str
    # The prompt as one string (chat: "role: content" lines), what prefix-cache
    # affinity hashes; its tokens are estimated from its length (see prompt_tokens).
    prompt: str = ""
    stream: bool = False
    max_tokens: int | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    # Endpoint Picker Protocol subset hint from the proxy: pick only inside it.
    subset: frozenset[str] | None = None
    # latency objectives from the SLO headers (milliseconds), None when not asked
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    # the decoded JSON body, for plugins that need what the fields above leave out (the
    # precise prefix-cache scorer tokenizes `prompt` or `messages` as the engine does)
    body: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)
    # ``model`` names an adapter of the EPP's LoRA catalogue (config ``lora.adapters``)
    lora_adapter: bool = False
    # characters per engine token, as learned from the servers' usage reports
    # (scheduling/latency.py TokenRatio); the estimate of prompt_tokens (4 for a prompt
    # of token ids: its text spells each id in 4 characters)
    chars_per_token: float = CHARS_PER_TOKEN
    # the prompt's tokens when known exactly (a prompt of token ids, counted): then
    # nothing is estimated, and its characters teach nothing about chars_per_token
    prompt_token_count: int | None = None

    @property
    def prompt_tokens(self) -> int:
        """The prompt's tokens, at least 1: ``prompt_token_count`` when known, else
        estimated (``chars_per_token`` characters each). What every token estimate of a
        request asks."""
        if self.prompt_token_count is not None:
            return max(1, self.prompt_token_count)
        return max(1, math.ceil(len(self.prompt) / self.chars_per_token))


@dataclass(frozen=True, slots=True)
class Prediction:
    """What the latency model expects of one request on one endpoint (seconds)."""

    ttft_s: float
    wait_s: float  # of which queueing for a slot
    uncached_tokens: int  # prompt tokens to prefill there
    tpot_s: float  # time per output token
    load: int  # requests on the endpoint before this one
    meets_slo: bool | None = None  # None: the request set no SLO


@dataclass(frozen=True, slots=True)
class SchedulingResult:
    """The chosen endpoints, primary first; later entries are fallbacks.

    ``prefill`` is set when the request is disaggregated: a separate endpoint computes
    the prompt's KV first and the targets (decode endpoints) continue from it;
    ``prefill_fallbacks`` take the prefill leg, in order, when ``prefill`` fails.
    ``decision`` names why (counted per value: ``disaggregated``, ``decode-only``,
    ``no-prefill-endpoint``; empty when no P/D handler ran).
    """

    targets: tuple[Endpoint, ...]
    prefill: Endpoint | None = None
    decision: str = ""
    prefill_fallbacks: tuple[Endpoint, ...] = ()
    # the latency model's expectation on the primary target
    prediction: Prediction | None = None

    @property
    def primary(self) -> Endpoint:
        return self.targets[0]

    @property
    def header_value(self) -> str:
        """The Endpoint Picker Protocol value: ``ip:port`` or ``ip:port,ip:port``."""
        return ",".join(t.address for t in self.targets)


def parse_host_port(value: str) -> tuple[str, int]:
    """Split ``host:port`` / ``[v6]:port``; raise ValueError with a precise message."""
    text = value.strip()
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or not rest.startswith(":"):
            raise ValueError(f"malformed address {value!r}: expected [ipv6]:port")
        port_text = rest[1:]
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep or not host:
            raise ValueError(f"malformed address {value!r}: expected host:port")
        if ":" in host:
            raise ValueError(f"malformed address {value!r}: bracket IPv6 hosts as [addr]:port")
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"malformed address {value!r}: port must be 1-65535")
    return host, int(port_text)
