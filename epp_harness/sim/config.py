"""SimConfig: every parameter of one simulated model server, validated once."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from epp.types import Role
from epp_harness.sim.faults import MetricsFault

# The simulator's one tokenizer rule: a token is about 4 characters of text.
CHARS_PER_TOKEN = 4

# the metric names /metrics can speak (epp.datalayer.engines has the same three)
METRICS_DIALECTS = ("vllm", "sglang", "trtllm")


def address(host: str, port: int) -> str:
    """``host:port``, IPv6 hosts bracketed."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class KvConnector(StrEnum):
    """How a prefill instance hands its KV to a decode instance (epp_harness.sim.handoff)."""

    NIXL = "nixl"  # vLLM NixlConnector: the decode pulls blocks named in kv_transfer_params
    SGLANG = "sglang"  # SGLang bootstrap rendezvous: both legs run at once
    MOONCAKE = "mooncake"  # SGLang's Mooncake transfer backend: the same rendezvous
    POOL = "pool"  # a KV pool shared by all instances (Mooncake store, LMCache)

    @property
    def rendezvous(self) -> bool:
        return self in (KvConnector.SGLANG, KvConnector.MOONCAKE)


@dataclass(frozen=True, slots=True)
class SimConfig:
    """Parameters of one simulator instance (all latencies in ms before ``time_scale``).

    ``time_scale`` multiplies every simulated latency; 0 answers instantly (nothing
    sleeps, output and counters stay exact). Construction raises ValueError on values
    that make no sense, so an invalid config never reaches the server.
    """

    model: str = "sim-model"
    instance_id: str = "sim"
    host: str = "127.0.0.1"
    port: int = 8000
    max_num_seqs: int = 16
    kv_blocks: int = 8192
    block_size: int = 16
    prefill_overhead_ms: float = 5.0
    prefill_ms_per_token: float = 0.05
    decode_ms_per_token: float = 8.0
    itl_ms_per_running_seq: float = 0.5
    # Step-level batching with chunked prefill (epp_harness.sim.steps): the per-step token
    # budget, as vLLM's --max-num-batched-tokens; 0 = per-request timing, no interference.
    max_num_batched_tokens: int = 2048
    default_max_tokens: int = 16
    time_scale: float = 1.0
    # ORCA response header on non-streaming responses: none | text | json | bin
    orca_format: str = "none"
    # usage.prompt_tokens_details.cached_tokens, as vLLM --enable-prompt-tokens-details
    # (off by default there too, so a router cannot come to rely on it unnoticed)
    enable_prompt_tokens_details: bool = False
    # Prefill/decode disaggregation (epp_harness.sim.handoff). The three times below are wall
    # time: ``time_scale`` does not apply, as they model protocol timeouts, not compute.
    role: Role = Role.BOTH
    kv_connector: KvConnector = KvConnector.NIXL
    kv_hold_seconds: float = 30.0  # how long a NIXL prefill keeps blocks for pickup
    bootstrap_timeout_seconds: float = 10.0  # rendezvous wait, and the NIXL pull's timeout
    kv_transfer_ms_per_token: float = 0.005  # decode-side cost of KV received, scaled
    kv_pool_dir: str | None = None  # the shared pool (kv_connector pool only)
    bootstrap_port: int | None = None  # a separate rendezvous port (sglang/mooncake)
    # KV events (epp_harness.sim.kv_events): publish on this port (0 = a free one;
    # None = off); prompts are then tokenized (epp_harness.sim.tokenizer)
    kv_events_port: int | None = None
    kv_events_replay_port: int | None = None
    kv_events_topic: str = ""
    # LoRA (epp_harness.sim.lora): on with enable_lora, as vLLM's --enable-lora
    enable_lora: bool = False
    max_loras: int = 1  # GPU adapter slots (vLLM's default)
    lora_modules: tuple[tuple[str, str], ...] = ()  # (name, path) registered at start
    lora_swap_ms: float = 50.0  # cost of evicting an adapter from a full slot table
    # whose metric names /metrics uses: vllm | sglang | trtllm (epp_harness.sim.metrics)
    metrics_dialect: str = "vllm"
    # injected faults (epp_harness.sim.faults): (status, share) pairs answered instead of
    # a generation, /metrics failing or slow, and the seed of the per-request draws
    fault_status: tuple[tuple[int, float], ...] = ()
    fault_metrics: MetricsFault = field(default_factory=MetricsFault)
    fault_seed: int = 0

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("model must not be empty")
        if self.orca_format not in ("none", "text", "json", "bin"):
            raise ValueError(
                f"orca_format must be none, text, json or bin, got {self.orca_format!r}"
            )
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be 0-65535, got {self.port}")
        self._check_disaggregation()
        if self.metrics_dialect not in METRICS_DIALECTS:
            raise ValueError(
                f"metrics_dialect must be one of {', '.join(METRICS_DIALECTS)}, "
                f"got {self.metrics_dialect!r}"
            )
        if self.lora_modules and not self.enable_lora:
            raise ValueError("lora_modules (--lora-modules) need enable_lora (--enable-lora)")
        if self.max_num_batched_tokens < 0:
            raise ValueError(
                f"max_num_batched_tokens must be >= 0, got {self.max_num_batched_tokens}"
            )
        if self.max_num_batched_tokens and self.max_num_batched_tokens < self.max_num_seqs:
            # vLLM refuses this too: every running decode needs a token of the budget.
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be 0 (off) or "
                f">= max_num_seqs ({self.max_num_seqs})"
            )
        for name in ("max_num_seqs", "max_loras", "kv_blocks", "block_size", "default_max_tokens"):
            value = getattr(self, name)
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if self.kv_blocks < 2:
            # one block is reserved, as vLLM's null block (epp_harness.sim.block_pool)
            raise ValueError(f"kv_blocks must be >= 2, got {self.kv_blocks}")
        for name in (
            "prefill_overhead_ms",
            "prefill_ms_per_token",
            "decode_ms_per_token",
            "itl_ms_per_running_seq",
            "time_scale",
            "kv_hold_seconds",
            "bootstrap_timeout_seconds",
            "kv_transfer_ms_per_token",
            "lora_swap_ms",
        ):
            value = getattr(self, name)
            # `not value >= 0` also rejects NaN.
            if not value >= 0 or value == float("inf"):
                raise ValueError(f"{name} must be a finite number >= 0, got {value}")

    def _check_disaggregation(self) -> None:
        pool = self.kv_connector is KvConnector.POOL
        if pool and not self.kv_pool_dir:
            raise ValueError(
                "kv_connector pool needs a kv_pool_dir (--kv-pool-dir) shared by all instances"
            )
        if self.kv_pool_dir and not pool:
            raise ValueError(
                f"kv_pool_dir only applies to kv_connector pool, not {self.kv_connector}"
            )
        if self.bootstrap_port is not None:
            if not self.kv_connector.rendezvous:
                raise ValueError(
                    f"bootstrap_port (--bootstrap-port) only applies to kv_connector sglang "
                    f"or mooncake, "
                    f"not {self.kv_connector}"
                )
            if not 0 <= self.bootstrap_port <= 65535:
                raise ValueError(f"bootstrap_port must be 0-65535, got {self.bootstrap_port}")

    @property
    def block_chars(self) -> int:
        """Characters of prompt text per KV block (the prefix cache's hashing unit)."""
        return self.block_size * CHARS_PER_TOKEN
