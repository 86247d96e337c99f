"""Scrape every endpoint's ``/metrics`` into the datastore, one loop per endpoint.

Each loop GETs ``http://{address}/metrics`` over one shared keep-alive session, parses
it with the endpoint's engine (:mod:`epp.datalayer.prometheus`) and replaces the
endpoint's metrics (keeping its last ORCA values, which come from another source).
A failed scrape (connect error, timeout, non-200, unparsable page, unknown engine)
counts in ``epp_scrape_failures_total{endpoint}`` and leaves the metrics alone, so their
``updated_at`` stops advancing and the scheduler's staleness bound takes over. When the
server cannot be reached at all (connect error; a timeout, marked ``slow``)
``on_unreachable`` is also told, which is how failure ejection
(:mod:`epp.datalayer.ejection`) hears of dead servers that get no traffic; a scrape
that worked tells ``on_success`` (the server is reachable: failures to reach it start
over, 5xx answers do not).

Logging stays quiet at 20 scrapes a second: a warning when an endpoint starts failing,
debug while it keeps failing, info when it recovers.

**Scrape budget.** A scrape costs the EPP about 0.5-1 ms of CPU (aiohttp, the kernel's
loopback work, parsing; ``bench/results/scrape.md``), so 100 endpoints every 50 ms
would take more than a core. ``max_per_s`` (:class:`ScrapePace`) caps the scrapes of all
loops together:
every loop waits ``endpoints / max_per_s`` instead of ``interval_s`` when that is longer
(:func:`scrape_interval`), but only as far as :func:`stretch_ceiling` allows, so that an
endpoint whose scrape fails once (its timeout) is still fresh for the scheduler (its
``stale_after_s``); past that the budget gives way, with a warning. A new loop's first
scrape waits a random part of the stretch, so a pool that appears at once (start-up, an
EDS push) is scraped at the budget's pace from the start. The interval in force is the
gauge ``epp_scrape_interval_seconds``.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Protocol

import aiohttp

from epp.datalayer.engines import engine_names
from epp.datalayer.prometheus import parse_metrics
from epp.datalayer.tasks import EndpointTasks
from epp.datastore import Datastore
from epp.errors import InternalError
from epp.observability.metrics import EppMetrics
from epp.types import Endpoint

log = logging.getLogger(__name__)

METRICS_PATH = "/metrics"
# Classic text format, uncompressed: on a scrape every 50 ms, gzip would cost CPU in
# the model server and here for bytes that mostly cross a fast network.
REQUEST_HEADERS = {"Accept": "text/plain; version=0.0.4", "Accept-Encoding": "identity"}


def stretch_ceiling(stale_after_s: float, timeout_s: float, jitter: float) -> float:
    """The longest interval the budget may stretch to: an endpoint whose scrape fails
    once, within ``timeout_s`` or half of ``stale_after_s`` (whichever is shorter), is
    still fresh, because two waits (each up to ``jitter`` longer than the interval) and
    that failure fit within ``stale_after_s``. A scrape slower than half the staleness
    bound lets the metrics go stale whatever the interval, which is what the bound is
    for; it must not stop the budget from working."""
    return (stale_after_s - min(timeout_s, stale_after_s / 2)) / (2 * (1 + jitter))


def scrape_interval(base_s: float, endpoints: int, max_per_s: float, ceiling_s: float) -> float:
    """Seconds between two scrapes of one endpoint: ``base_s``, stretched so that
    ``endpoints`` loops together make at most ``max_per_s`` scrapes a second (0 = no
    limit), but never past ``ceiling_s`` (nor below ``base_s``)."""
    if max_per_s <= 0:
        return base_s
    return max(base_s, min(endpoints / max_per_s, ceiling_s))


class Unreachable(Protocol):
    """Told (address, reason, slow) when a scrape could not reach the server; ``slow``:
    it timed out rather than being refused."""

    def __call__(self, address: str, reason: str, slow: bool, /) -> None: ...


class ScrapeError(InternalError):
    """A scrape that did not produce metrics; the message says why."""


class ScrapePace:
    """How often each endpoint is scraped: every ``interval_s`` (each wait up to
    ``jitter`` shorter or longer), stretched so that all loops together make at most
    ``max_per_s`` scrapes a second (0 = no limit), as far as :func:`stretch_ceiling`
    allows for ``stale_after_s`` and the scrape's ``timeout_s``; it warns once when the
    pool outgrows the budget and says when it fits again."""

    def __init__(
        self,
        interval_s: float = 0.05,
        max_per_s: float = 0.0,
        stale_after_s: float = 2.0,
        timeout_s: float = 1.0,
        jitter: float = 0.2,
        rng: random.Random | None = None,
    ) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        if not max_per_s >= 0:
            raise ValueError(f"max_per_s must be >= 0 (0 = no limit), got {max_per_s}")
        if not stale_after_s > 0:
            raise ValueError(f"stale_after_s must be > 0, got {stale_after_s}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if not 0 <= jitter < 1:
            raise ValueError(f"jitter must be in [0, 1), got {jitter}")
        self.base_s = interval_s
        self.timeout_s = timeout_s  # one scrape's limit
        self._max_per_s = max_per_s
        self._ceiling_s = stretch_ceiling(stale_after_s, timeout_s, jitter)
        self._stale_after_s = stale_after_s
        self._jitter = jitter
        self._rng = rng if rng is not None else random.Random()
        self._over_budget = False

    def interval_s(self, endpoints: int) -> float:
        """Seconds between two scrapes of one endpoint in a pool of ``endpoints``."""
        return scrape_interval(self.base_s, endpoints, self._max_per_s, self._ceiling_s)

    def first_wait(self, endpoints: int) -> float | None:
        """A new loop's wait before its first scrape: a random part of the stretch when
        the budget stretches the interval (a pool that appears at once is scraped at
        the budget's pace from the start), else None (at once)."""
        stretch = self.interval_s(endpoints) - self.base_s
        return self._rng.uniform(0.0, stretch) if stretch > 0 else None

    def delay(self, endpoints: int) -> float:
        """The wait after a scrape: the interval, jittered."""
        interval = self.interval_s(endpoints)
        self._note_budget(endpoints, interval)
        return interval * self._rng.uniform(1 - self._jitter, 1 + self._jitter)

    def _note_budget(self, n: int, interval: float) -> None:
        """Warn once when the pool outgrows the scrape budget, info when it fits again."""
        over = self._max_per_s > 0 and n / interval > self._max_per_s * 1.0001
        if over == self._over_budget:
            return
        self._over_budget = over
        if over:
            log.warning(
                "%d endpoints scraped every %gs is %.0f scrapes/s, over the budget of %g "
                "(dataLayer.maxScrapesPerSecond); a longer interval would let one failed "
                "scrape (a %gs timeout) age an endpoint's metrics past "
                "dataLayer.staleAfterSeconds (%gs)",
                n, interval, n / interval, self._max_per_s, self.timeout_s,
                self._stale_after_s,
            )  # fmt: skip
        else:
            log.info("scrapes are within the budget of %g a second again", self._max_per_s)


class MetricsScraper:
    """Keeps every endpoint's Prometheus metrics fresh in ``datastore``, at the pace
    of ``pace`` (defaults: :class:`ScrapePace`'s)."""

    def __init__(
        self,
        datastore: Datastore,
        eppmetrics: EppMetrics,
        pace: ScrapePace | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_unreachable: Unreachable | None = None,
        on_success: Callable[[str], None] | None = None,
    ) -> None:
        self._datastore = datastore
        self._failures = eppmetrics.scrape_failures
        self._scrapes = eppmetrics.scrapes
        # told (address, reason) when a server cannot be reached at all (failure ejection)
        self._on_unreachable = on_unreachable
        self._on_success = on_success
        self._pace = pace if pace is not None else ScrapePace()
        self._timeout_s = self._pace.timeout_s
        self._clock = clock
        self._session: aiohttp.ClientSession | None = None
        self._tasks = EndpointTasks("scrape", datastore, self._run)
        eppmetrics.report_scrape_interval(self.interval_s)
        # endpoints whose last scrape failed (their failures log at debug level)
        self._failing: set[str] = set()

    def start(self) -> None:
        """Open the HTTP session and start one loop per endpoint (following membership).
        Call from inside the running event loop."""
        asyncio.get_running_loop()  # RuntimeError outside a loop, before any side effect
        if self._session is not None:
            return
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=30.0),
            # no aiohttp timeout: see scrape_once
            timeout=aiohttp.ClientTimeout(total=None),
            headers=REQUEST_HEADERS,
            cookie_jar=aiohttp.DummyCookieJar(),
            trust_env=False,
        )
        self._tasks.start()

    async def stop(self) -> None:
        """Cancel every loop, wait for them, close the session."""
        await self._tasks.stop()
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()
        self._failing.clear()

    def addresses(self) -> list[str]:
        """Endpoints that currently have a scrape loop."""
        return self._tasks.addresses()

    async def scrape_once(self, endpoint: Endpoint) -> bool:
        """Scrape ``endpoint`` once and store what it reports; True on success.

        Every failure is counted and logged, never raised (only cancellation and a
        call before :meth:`start` raise).
        """
        session = self._session
        if session is None:
            raise RuntimeError("MetricsScraper.scrape_once() before start()")
        address = endpoint.address
        self._scrapes.inc()
        try:
            names = engine_names(endpoint.engine)
            # asyncio.timeout, not aiohttp's ClientTimeout: when a cancel (endpoint
            # removed, stop()) lands just after aiohttp's timer fired, aiohttp 3.14's
            # nested timer contexts uncancel the task twice and turn the cancel into a
            # TimeoutError, so the loop would never end (aio-libs/aiohttp#5979).
            async with asyncio.timeout(self._timeout_s):
                text = await self._fetch(session, address)
            metrics = parse_metrics(text, names, self._clock())
        except asyncio.CancelledError:
            raise
        except TimeoutError:
            self._failed(
                address, f"no answer within {self._timeout_s:g}s", unreachable=True, slow=True
            )
            return False
        except (aiohttp.ClientConnectionError, OSError) as exc:
            self._failed(address, _reason(exc), unreachable=True)
            return False
        except (aiohttp.ClientError, ScrapeError, ValueError) as exc:
            # ValueError: MetricsParseError or an unknown engine
            self._failed(address, _reason(exc))
            return False
        except Exception as exc:  # a bug: keep the loop alive, show the traceback
            self._failed(address, f"unexpected error: {_reason(exc)}", exc_info=exc)
            return False
        state = self._datastore.get(address)
        if state is None:  # left the pool while we were scraping
            return False
        if state.metrics is not None and state.metrics.orca:
            metrics = replace(metrics, orca=state.metrics.orca)
        self._datastore.update_metrics(address, metrics)
        if self._on_success is not None:
            self._on_success(address)
        if address in self._failing:
            self._failing.discard(address)
            log.info("scraping %s%s works again", address, METRICS_PATH)
        return True

    @staticmethod
    async def _fetch(session: aiohttp.ClientSession, address: str) -> str:
        async with session.get(f"http://{address}{METRICS_PATH}") as resp:
            if resp.status != 200:
                raise ScrapeError(f"HTTP {resp.status} {resp.reason or ''}".rstrip())
            body = await resp.read()
        try:
            return body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ScrapeError(f"body is not UTF-8: {exc}") from None

    def _failed(
        self,
        address: str,
        reason: str,
        exc_info: BaseException | None = None,
        unreachable: bool = False,
        slow: bool = False,
    ) -> None:
        self._failures.labels(address).inc()
        if unreachable and self._on_unreachable is not None:
            self._on_unreachable(address, f"scrape: {reason}", slow)
        if address in self._failing:
            log.debug("scraping %s%s failed again: %s", address, METRICS_PATH, reason)
            return
        self._failing.add(address)
        log.warning(
            "scraping %s%s failed: %s (further failures are logged at debug level)",
            address,
            METRICS_PATH,
            reason,
            exc_info=exc_info,
        )

    def interval_s(self) -> float:
        """Seconds between two scrapes of one endpoint, for the current pool size."""
        return self._pace.interval_s(self._tasks.count())

    async def _run(self, endpoint: Endpoint) -> None:
        try:
            wait = self._pace.first_wait(self._tasks.count())
            if wait is not None:  # a pool the budget stretches: the first round spread
                await asyncio.sleep(wait)
            while True:
                await self.scrape_once(endpoint)
                await asyncio.sleep(self._pace.delay(self._tasks.count()))
        finally:
            self._failing.discard(endpoint.address)


def _reason(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
