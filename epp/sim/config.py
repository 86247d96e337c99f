"""SimConfig: every parameter of one simulated model server, validated once."""

from __future__ import annotations

from dataclasses import dataclass

# The simulator's one tokenizer rule: a token is about 4 characters of text.
CHARS_PER_TOKEN = 4


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
    default_max_tokens: int = 16
    time_scale: float = 1.0
    # ORCA response header on non-streaming responses: none | text | json | bin
    orca_format: str = "none"

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("model must not be empty")
        if self.orca_format not in ("none", "text", "json", "bin"):
            raise ValueError(
                f"orca_format must be none, text, json or bin, got {self.orca_format!r}"
            )
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be 0-65535, got {self.port}")
        for name in ("max_num_seqs", "kv_blocks", "block_size", "default_max_tokens"):
            value = getattr(self, name)
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        for name in (
            "prefill_overhead_ms",
            "prefill_ms_per_token",
            "decode_ms_per_token",
            "itl_ms_per_running_seq",
            "time_scale",
        ):
            value = getattr(self, name)
            # `not value >= 0` also rejects NaN.
            if not value >= 0 or value == float("inf"):
                raise ValueError(f"{name} must be a finite number >= 0, got {value}")

    @property
    def block_chars(self) -> int:
        """Characters of prompt text per KV block (the prefix cache's hashing unit)."""
        return self.block_size * CHARS_PER_TOKEN
