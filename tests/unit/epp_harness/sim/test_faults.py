"""The simulator's injected faults: parsing the flags' values, and seeded draws."""

from __future__ import annotations

import pytest

from epp_harness.sim.faults import Faults, MetricsFault, parse_fault_metrics, parse_fault_status


def test_status_shares_parse() -> None:
    assert parse_fault_status("503:0.2, 404:0.1") == ((503, 0.2), (404, 0.1))
    assert parse_fault_status("") == ()


@pytest.mark.parametrize("text", ["503", "503:x", "200:0.1", "503:1.5", "503:0.6,500:0.6"])
def test_bad_status_shares_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_fault_status(text)


def test_metrics_faults_parse() -> None:
    assert parse_fault_metrics("ok") == MetricsFault()
    assert parse_fault_metrics("fail") == MetricsFault(fail=True)
    assert parse_fault_metrics("slow:2.5") == MetricsFault(delay_s=2.5)
    assert parse_fault_metrics("slow:2.5").spec == "slow:2.5"


@pytest.mark.parametrize("text", ["slow", "slow:-1", "slow:inf", "down", "fail:1"])
def test_bad_metrics_faults_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_fault_metrics(text)


def test_same_seed_same_requests_fail() -> None:
    def run(seed: int) -> list[int | None]:
        faults = Faults(((503, 0.2), (404, 0.1)), seed=seed)
        return [faults.draw() for _ in range(2000)]

    first = run(7)
    assert first == run(7) and first != run(8)
    assert 0.15 < first.count(503) / 2000 < 0.25 and 0.06 < first.count(404) / 2000 < 0.14


def test_a_fault_set_later_hits_the_same_requests() -> None:
    """One draw per request whatever the fault: the requests a share hits depend on the
    seed and their place in the order, not on what was set before."""
    quiet, loud = Faults(seed=3), Faults(((500, 0.5),), seed=3)
    for _ in range(10):
        assert quiet.draw() is None
        loud.draw()
    quiet.statuses = loud.statuses
    assert [quiet.draw() for _ in range(50)] == [loud.draw() for _ in range(50)]
