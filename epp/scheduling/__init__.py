"""Scheduling: pure functions of (request, snapshot, rng) -> SchedulingResult."""

from epp.scheduling.base import Scheduler
from epp.scheduling.least_request import LeastRequestScheduler

__all__ = ["LeastRequestScheduler", "Scheduler"]
