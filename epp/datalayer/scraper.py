"""Scrape every endpoint's ``/metrics`` into the datastore, one loop per endpoint.

Each loop GETs ``http://{address}/metrics`` over one shared keep-alive session, parses
it with the endpoint's engine (:mod:`epp.datalayer.prometheus`) and replaces the
endpoint's metrics (keeping its last ORCA values, which come from another source).
A failed scrape (connect error, timeout, non-200, unparsable page, unknown engine)
counts in ``epp_scrape_failures_total{endpoint}`` and leaves the metrics alone, so their
``updated_at`` stops advancing and the scheduler's staleness bound takes over. When the
server cannot be reached at all (connect error, timeout) ``on_unreachable`` is also told,
which is how failure ejection (:mod:`epp.datalayer.ejection`) hears of dead servers
that get no traffic.

Logging stays quiet at 20 scrapes a second: a warning when an endpoint starts failing,
debug while it keeps failing, info when it recovers.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from dataclasses import replace

import aiohttp

from epp.admin.metrics import EppMetrics
from epp.datalayer.engines import engine_names
from epp.datalayer.prometheus import parse_metrics
from epp.datalayer.tasks import EndpointTasks
from epp.datastore import Datastore
from epp.types import Endpoint

log = logging.getLogger(__name__)

METRICS_PATH = "/metrics"
# Classic text format, uncompressed: on a scrape every 50 ms, gzip would cost CPU in
# the model server and here for bytes that mostly cross a fast network.
REQUEST_HEADERS = {"Accept": "text/plain; version=0.0.4", "Accept-Encoding": "identity"}


class ScrapeError(Exception):
    """A scrape that did not produce metrics; the message says why."""


class MetricsScraper:
    """Keeps every endpoint's Prometheus metrics fresh in ``datastore``."""

    def __init__(
        self,
        datastore: Datastore,
        eppmetrics: EppMetrics,
        *,
        interval_s: float = 0.05,
        timeout_s: float = 1.0,
        jitter: float = 0.2,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        on_unreachable: Callable[[str, str], None] | None = None,
    ) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if not 0 <= jitter < 1:
            raise ValueError(f"jitter must be in [0, 1), got {jitter}")
        self._datastore = datastore
        self._failures = eppmetrics.scrape_failures
        # told (address, reason) when a server cannot be reached at all (failure ejection)
        self._on_unreachable = on_unreachable
        self._interval_s = interval_s
        self._timeout_s = timeout_s
        self._jitter = jitter
        self._clock = clock
        self._rng = rng if rng is not None else random.Random()
        self._session: aiohttp.ClientSession | None = None
        self._tasks = EndpointTasks("scrape", datastore, self._run)
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
            self._failed(address, f"no answer within {self._timeout_s:g}s", unreachable=True)
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
    ) -> None:
        self._failures.labels(address).inc()
        if unreachable and self._on_unreachable is not None:
            self._on_unreachable(address, f"scrape: {reason}")
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

    def _delay(self) -> float:
        return self._interval_s * self._rng.uniform(1 - self._jitter, 1 + self._jitter)

    async def _run(self, endpoint: Endpoint) -> None:
        try:
            while True:
                await self.scrape_once(endpoint)
                await asyncio.sleep(self._delay())
        finally:
            self._failing.discard(endpoint.address)


def _reason(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
