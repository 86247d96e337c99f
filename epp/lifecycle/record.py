"""What one routed request carries through its lifecycle: its pick, its claim on the
endpoint, its timings. It is the event object the hooks are given (``Routing``). And,
when an observer follows exchanges, what one request carries from its headers to the
end of its stream (``Exchange``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from epp.datastore import InFlightTicket
from epp.lifecycle.bus import Hooks
from epp.types import InferenceRequest, SchedulingResult


@dataclass(slots=True, eq=False)
class Received:
    """A received request: its exchange, opened at its headers (the ``Exchange`` of the
    exchange hooks); its ``notes`` become its ``Routed``'s once it is routed."""

    headers: Mapping[str, str]
    request_id: str
    notes: list[Any]  # the observers' per-request state (Hooks.new_notes)
    refused: tuple[int, str] | None = None  # the EPP's own error answer: status, code


@dataclass(frozen=True, slots=True)
class DeferredDecode:
    """A disaggregated request whose decode endpoint is picked after its prefill leg."""

    max_destinations: int
    scheduling_s: float  # the first cycle's time (the llm-d metrics count both)


@dataclass(slots=True, eq=False)
class Routed:
    """A routed request (identity equality: observers may key on it)."""

    request: InferenceRequest
    # deferred decode selection: targets are the first cycle's decode picks until the
    # pick after the prefill leg replaces them
    result: SchedulingResult
    # the claim on the primary target (deferred: on no endpoint yet, Datastore.PENDING)
    ticket: InFlightTicket
    hooks: Hooks  # whose ``ended`` observers hear of its release
    notes: list[Any]  # the observers' per-request state (Hooks.new_notes)
    # the prefill endpoint's claim while the request lives (sidecar coordinator)
    prefill_ticket: InFlightTicket | None = None
    flow_id: str | None = None  # its flow in flow control, if admitted through it
    routed_at: float = 0.0  # the lifecycle clock when scheduling began
    sent_at: float = 0.0  # ... when the pick was done
    scheduling_s: float = 0.0  # how long the pick took
    first_byte_at: float | None = None
    deferred: DeferredDecode | None = None  # its decode endpoint is not chosen yet
    done: bool = False  # released: no longer in flight

    @property
    def decode_pending(self) -> bool:
        return self.deferred is not None

    @property
    def adapter(self) -> str | None:
        """The LoRA adapter it names (its servers are the adapter's holders)."""
        request = self.request
        return request.model if request.lora_adapter else None

    def release(self) -> None:
        """It stops being in flight: its claims go, and (once) the ``ended`` hooks run."""
        self.ticket.release()
        if self.prefill_ticket is not None:
            self.prefill_ticket.release()
        if not self.done:
            self.done = True
            for hook in self.hooks.ended:
                hook(self)
