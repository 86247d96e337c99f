"""Glue between the Envoy adapter and the pure scheduler: take a snapshot, schedule,
claim in-flight accounting, count the outcome."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

from epp.admin.metrics import EppMetrics
from epp.datastore import Datastore, InFlightTicket
from epp.errors import EppError
from epp.scheduling import Scheduler
from epp.types import InferenceRequest, SchedulingResult
from epp.usage import Usage


@dataclass(slots=True)
class Routed:
    result: SchedulingResult
    ticket: InFlightTicket


class Router:
    def __init__(
        self,
        datastore: Datastore,
        scheduler: Scheduler,
        metrics: EppMetrics,
        *,
        max_body_bytes: int,
        rng: random.Random | None = None,
    ) -> None:
        self.datastore = datastore
        self.scheduler = scheduler
        self.metrics = metrics
        self.max_body_bytes = max_body_bytes
        self.rng = rng or random.Random()

    def route(self, request: InferenceRequest) -> Routed:
        start = time.perf_counter()
        result = self.scheduler.schedule(request, self.datastore.snapshot(), self.rng)
        self.metrics.scheduling_seconds.observe(time.perf_counter() - start)
        self.metrics.requests.labels("routed").inc()
        return Routed(result, self.datastore.acquire(result.primary.address))

    def rejected(self, error: EppError) -> None:
        self.metrics.requests.labels(str(error.status)).inc()

    def response_seen(self, address: str, status: int) -> None:
        self.metrics.responses.labels(address, f"{status // 100}xx").inc()

    def usage_seen(self, usage: Usage) -> None:
        self.metrics.tokens.labels("prompt").inc(usage.prompt_tokens)
        self.metrics.tokens.labels("completion").inc(usage.completion_tokens)
