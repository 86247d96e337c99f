"""The scrape budget: how long each endpoint's loop waits, by pool size."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from epp.datalayer.scraper import scrape_interval, stretch_ceiling


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


def test_the_default_ceiling_survives_one_failed_scrape() -> None:
    # staleAfterSeconds 2, a failure within 1 s (half of it), jitter 20 %: (2 - 1) / 2.4
    assert stretch_ceiling(2.0, 5.0, 0.2) == pytest.approx(0.41667, abs=1e-5)
    assert stretch_ceiling(2.0, 1.0, 0.2) == pytest.approx(0.41667, abs=1e-5)
    assert stretch_ceiling(2.0, 0.2, 0.2) == pytest.approx(0.75)  # a short timeout: longer
    # a timeout longer than the staleness bound still leaves the budget working
    assert stretch_ceiling(0.3, 1.0, 0.2) == pytest.approx(0.0625)


@given(
    stale=st.floats(0.01, 60),
    timeout=st.floats(0.001, 60),
    jitter=st.floats(0, 0.99),
    base=st.floats(0.001, 1),
    endpoints=st.integers(0, 100_000),
    budget=st.floats(0.1, 10_000),
)
def test_a_stretched_interval_never_lets_one_failed_scrape_go_stale(
    stale: float, timeout: float, jitter: float, base: float, endpoints: int, budget: float
) -> None:
    interval = scrape_interval(base, endpoints, budget, stretch_ceiling(stale, timeout, jitter))
    assert interval >= base
    if interval > base:  # stretched by the budget: a good scrape, a wait, a scrape that
        # fails within the timeout or half the bound, a wait, then the next good one, all
        # within the staleness bound
        assert 2 * interval * (1 + jitter) + min(timeout, stale / 2) <= stale * (1 + 1e-9)
