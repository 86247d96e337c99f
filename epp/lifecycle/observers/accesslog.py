"""``epp serve --access-log``: one log line per routing decision, from the lifecycle's
hooks (registered only with the flag, or at ``--log-level debug``: otherwise nothing of
it is on the request path)."""

from __future__ import annotations

import logging

from epp.lifecycle.hooks import LifecycleObserver, Routing

# its own logger, so the lines can be kept or routed apart from the rest
ACCESS_LOGGER = "epp.access"


class AccessLog(LifecycleObserver):
    """Logs where each inference request went and why: its id, model, the endpoints
    (primary first, then Envoy's fallbacks), the prefill endpoint, the P/D decision,
    the latency model's predicted time to first token, its flow, and the time the
    pick took. A request without a body (``GET /v1/models``) is no decision."""

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self.log = logger or logging.getLogger(ACCESS_LOGGER)

    def picked(self, routing: Routing) -> None:
        if not routing.decode_pending:  # else once its decode endpoint is picked
            self._line(routing)

    def decode_picked(self, routing: Routing, moved: bool | None) -> None:
        if moved is not None:
            self._line(routing)

    def _line(self, routing: Routing) -> None:
        request, result = routing.request, routing.result
        if request.model is None:
            return
        pred = result.prediction
        self.log.info(
            "routed request_id=%s model=%s endpoints=%s prefill=%s decision=%s "
            "predicted_ttft_ms=%s flow=%s scheduling_ms=%.3f",
            request.request_id,
            request.model,
            result.header_value,
            "-" if result.prefill is None else result.prefill.address,
            result.decision or "-",
            "-" if pred is None else f"{pred.ttft_s * 1000:.1f}",
            routing.flow_id or "-",
            routing.scheduling_s * 1000,
        )
