"""Injected faults (for fault tests and the scenario matrix): a share of generation
requests answered with an error status in vLLM's error shape, and a slow or failing
``/metrics``. Seeded, so a run that sends the same requests in the same order gets the
same faults. Set at start (``--fault-status``, ``--fault-metrics``, ``--fault-seed``)
or at runtime (``POST /sim/faults``)."""

from __future__ import annotations

import random
from dataclasses import dataclass

# the statuses a share of requests can be answered with
FAULT_STATUSES = (400, 404, 408, 429, 500, 502, 503, 504)
# every injected error's message starts with this, so a client can tell it from a real one
FAULT_MESSAGE = "injected fault"


@dataclass(frozen=True, slots=True)
class MetricsFault:
    """``/metrics`` answering 503 (``fail``) or after ``delay_s`` seconds (``slow``)."""

    fail: bool = False
    delay_s: float = 0.0

    @property
    def spec(self) -> str:
        return "fail" if self.fail else f"slow:{self.delay_s:g}" if self.delay_s else "ok"


def parse_fault_status(text: str) -> tuple[tuple[int, float], ...]:
    """``"503:0.2,404:0.1"`` → ((503, 0.2), (404, 0.1)); ``""`` → (): no fault. Shares
    are fractions of generation requests; together at most 1."""
    shares: list[tuple[int, float]] = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        status_text, sep, share_text = item.partition(":")
        try:
            status, share = int(status_text), float(share_text)
        except ValueError:
            raise ValueError(f"expected STATUS:SHARE, got {item!r}") from None
        if not sep or status not in FAULT_STATUSES:
            raise ValueError(
                f"expected STATUS:SHARE with STATUS one of "
                f"{', '.join(map(str, FAULT_STATUSES))}, got {item!r}"
            )
        if not 0 <= share <= 1:
            raise ValueError(f"a share is 0..1, got {item!r}")
        shares.append((status, share))
    if sum(share for _, share in shares) > 1 + 1e-9:
        raise ValueError(f"the shares add up to more than 1: {text!r}")
    return tuple(shares)


def parse_fault_metrics(text: str) -> MetricsFault:
    """``ok`` (or ``""``), ``fail`` or ``slow:SECONDS``."""
    if text in ("", "ok"):
        return MetricsFault()
    if text == "fail":
        return MetricsFault(fail=True)
    kind, sep, seconds = text.partition(":")
    try:
        delay = float(seconds)
    except ValueError:
        delay = -1.0
    if kind != "slow" or not sep or not 0 <= delay < float("inf"):
        raise ValueError(f"expected ok, fail or slow:SECONDS, got {text!r}")
    return MetricsFault(delay_s=delay)


class Faults:
    """The faults one simulator injects now; ``draw`` is called once per generation
    request, in arrival order."""

    def __init__(
        self,
        statuses: tuple[tuple[int, float], ...] = (),
        metrics: MetricsFault = MetricsFault(),
        seed: int = 0,
    ) -> None:
        self.statuses = statuses
        self.metrics = metrics
        self._rng = random.Random(seed)
        self.injected = 0  # requests answered with an injected status so far

    def draw(self) -> int | None:
        """The status to answer the next request with, or None to serve it. Draws one
        number per request even with no fault set, so a fault set later applies to the
        same requests whatever came before."""
        x = self._rng.random()
        for status, share in self.statuses:
            if x < share:
                self.injected += 1
                return status
            x -= share
        return None

    def status_spec(self) -> str:
        return ",".join(f"{status}:{share:g}" for status, share in self.statuses)

    def reseed(self, seed: int) -> None:
        self._rng.seed(seed)
