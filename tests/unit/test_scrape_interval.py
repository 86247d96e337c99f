"""The scrape budget: how long each endpoint's loop waits, by pool size."""

import pytest

from epp.datalayer.scraper import scrape_interval


@pytest.mark.parametrize(
    ("endpoints", "max_per_s", "ceiling_s", "expected"),
    [
        (4, 400.0, 0.5, 0.05),  # well within the budget: the configured interval
        (20, 400.0, 0.5, 0.05),  # exactly the budget
        (40, 400.0, 0.5, 0.1),  # twice the budget: every loop waits twice as long
        (100, 400.0, 0.5, 0.25),
        (1000, 400.0, 0.5, 0.5),  # would be 2.5 s: held at the staleness ceiling
        (1000, 0.0, 0.5, 0.05),  # 0 = no budget
        (0, 400.0, 0.5, 0.05),
        (1000, 400.0, 0.01, 0.05),  # a ceiling below the interval never shortens it
    ],
)
def test_interval_stretches_with_the_pool_up_to_the_ceiling(
    endpoints: int, max_per_s: float, ceiling_s: float, expected: float
) -> None:
    assert scrape_interval(0.05, endpoints, max_per_s, ceiling_s) == pytest.approx(expected)
