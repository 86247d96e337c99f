"""A lifecycle owner composed as ``epp serve`` composes it, for tests that drive the
request path without a process: the built-in observers, plus ``observers`` (failure
ejection, LoRA placement, or a test's own)."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence

from epp.datastore import Datastore
from epp.disagg.coordinators import Coordinator
from epp.flowcontrol.controller import FlowController
from epp.flowcontrol.queues import FlowControlConfig
from epp.lifecycle.bus import Hooks
from epp.lifecycle.hooks import LifecycleObserver
from epp.lifecycle.observers import builtin_observers
from epp.lifecycle.picking import Picking
from epp.lifecycle.resolving import ModelResolver
from epp.observability.metrics import EppMetrics
from epp.router import Router, StreamOptions
from epp.scheduling.base import Scheduler


def make_router(
    datastore: Datastore,
    scheduler: Scheduler,
    metrics: EppMetrics | None = None,
    *,
    stream: StreamOptions | None = None,
    coordinator: Coordinator | None = None,
    flow: FlowControlConfig | None = None,
    rng: random.Random | None = None,
    clock: Callable[[], float] = time.monotonic,
    observers: Sequence[LifecycleObserver] = (),
) -> Router:
    """``flow``: flow control's config (default: the default config, on the
    lifecycle's ``clock``)."""
    metrics = metrics or EppMetrics(datastore)
    controller = FlowController(flow or FlowControlConfig(), metrics, clock)
    rng = rng or random.Random()
    latency = scheduler.latency
    hooks = Hooks([*builtin_observers(metrics, datastore, latency, controller, clock), *observers])
    defers = bool(getattr(coordinator, "defers", False))
    picking = Picking(datastore, scheduler, hooks, rng=rng, clock=clock, defers=defers)
    return Router(
        picking,
        controller,
        metrics,
        resolver=ModelResolver(rng=rng),
        coordinator=coordinator,
        stream=stream or StreamOptions(max_body_bytes=1 << 20),
    )
