"""The ``dataLayer`` config section: how the EPP learns each endpoint's load."""

from __future__ import annotations

from dataclasses import dataclass, field

from epp.common.sections import section_key, setting
from epp.datalayer.engines import ENGINES


@dataclass(frozen=True)
class OrcaConfig:
    """ORCA load reports: in response headers, or streamed out of band."""

    request_format: str = setting(
        "none",
        "requestFormat",
        "ask vLLM for an ORCA load header on each response in this format",
        choices=("none", "TEXT", "JSON"),
    )
    oob_port: int | None = setting(
        None,
        "oobPort",
        "port of OpenRcaService on every endpoint's host, streamed; null: off",
        minimum=1,
        maximum=65535,
    )
    report_interval_s: float = setting(
        1.0, "reportIntervalSeconds", "interval the out-of-band streams ask for", minimum=0.01
    )

    @property
    def header_format(self) -> str | None:
        """The format to request in the ORCA header; None: request none."""
        return None if self.request_format == "none" else self.request_format


@dataclass(frozen=True)
class DataLayerConfig:
    """How endpoint load is learned: /metrics scrapes and ORCA reports."""

    scrape_metrics: bool = setting(True, "scrapeMetrics", "scrape each endpoint's /metrics")
    scrape_interval_s: float = setting(
        0.05, "scrapeIntervalSeconds", "seconds between two scrapes of one endpoint", minimum=0.001
    )
    max_scrapes_per_s: float = setting(
        400.0,
        "maxScrapesPerSecond",
        "scrapes per second over all endpoints; a larger pool is scraped less often (0: no limit)",
        minimum=0.0,
    )
    scrape_timeout_s: float = setting(
        5.0,
        "scrapeTimeoutSeconds",
        "give up on one scrape after this long (a busy engine renders /metrics slowly)",
        minimum=0.001,
    )
    stale_after_s: float = setting(
        2.0,
        "staleAfterSeconds",
        "load older than this is unknown to the scheduler",
        minimum=0.001,
    )
    engine: str = setting(
        "vllm", "engine", "metric names of endpoints that name no engine", choices=ENGINES.keys()
    )
    orca: OrcaConfig = field(default_factory=OrcaConfig, metadata=section_key("orca"))
