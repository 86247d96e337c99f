"""The scheduler contract the Envoy adapter depends on."""

from __future__ import annotations

import random
from typing import Protocol

from epp.types import InferenceRequest, SchedulingResult, Snapshot


class Scheduler(Protocol):
    def schedule(
        self, request: InferenceRequest, snapshot: Snapshot, rng: random.Random
    ) -> SchedulingResult:
        """Pick endpoints for ``request`` from ``snapshot``.

        Contract: synchronous and free of I/O; every returned target is one of the
        snapshot's endpoints; raises :class:`epp.errors.NoEndpointError` when none fits.
        """
        ...
