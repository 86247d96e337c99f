"""The latency model's robust line, fitted from running sums over its window, against
the batch fit it replaced: every point of the window summed afresh in Python, then the
same trims (plain data)."""

from __future__ import annotations

import random

import pytest

from epp.scheduling.latency import RobustLine


def batch_fit(
    points: list[tuple[float, float]], a0: float, b0: float, x_ref: float, weight: float
) -> tuple[float, float]:
    """The fit over ``points`` as the model made it on every observation before."""

    def fit(points: list[tuple[float, float]]) -> tuple[float, float]:
        w = weight * min(1.0, weight / max(len(points), 1))
        half = w / 2
        y_ref = a0 + b0 * x_ref
        n, sx = 2 * half, half * x_ref
        sy, sxx, sxy = half * a0 + half * y_ref, half * x_ref * x_ref, half * x_ref * y_ref
        for x, y in points:
            n, sx, sy, sxx, sxy = n + 1, sx + x, sy + y, sxx + x * x, sxy + x * y
        det = n * sxx - sx * sx
        if n <= 0 or det <= 1e-12 * max(n * sxx, 1e-300):
            return max(sy / n - b0 * sx / n, 0.0), b0
        b = (n * sxy - sx * sy) / det
        if b < 0:
            return max(sy / n, 0.0), 0.0
        a = (sy - b * sx) / n
        if a < 0:
            return 0.0, max(sxy / sxx, 0.0) if sxx > 0 else b0
        return a, b

    a, b = fit(points)
    for _ in range(2):
        if len(points) < 8:
            break
        residuals = [abs(py - a - b * px) for px, py in points]
        spread = sorted(residuals)[len(residuals) // 2] * 1.4826
        limit = 3.0 * max(spread, 1e-3 * max(abs(a), 1e-3))
        kept = [p for p, r in zip(points, residuals, strict=True) if r <= limit]
        if len(kept) == len(points):
            break
        points = kept
        a, b = fit(points)
    return a, b


@pytest.mark.parametrize(
    ("seed", "window", "x_scale", "outliers"),
    [
        (1, 128, 3000.0, 0.1),  # prefill: uncached tokens, a stalled request now and then
        (2, 16, 3000.0, 0.3),  # a short window turning over many times
        (3, 128, 32.0, 0.05),  # decode: the running batch
        (4, 8, 1.0, 0.0),  # the smallest window, x nearly constant
    ],
)
def test_the_incremental_fit_equals_the_batch_fit_after_every_observation(
    seed: int, window: int, x_scale: float, outliers: float
) -> None:
    rng = random.Random(seed)
    a0, b0, x_ref, weight = 0.01, 0.0001, 1000.0, 4.0
    line = RobustLine(a0, b0, x_ref, weight, window)
    points: list[tuple[float, float]] = []
    for i in range(window * 5 + 7):
        x = float(rng.randrange(0, int(x_scale) + 1))
        y = 0.008 + 0.0002 * x + rng.gauss(0, 0.002)
        if rng.random() < outliers:
            y += rng.uniform(0.5, 3.0)
        if i % 50 == 49:  # a window of identical sizes for a while
            x = 100.0
        line.add(x, y)
        points = [*points, (x, y)][-window:]
        expected = batch_fit(points, a0, b0, x_ref, weight)
        assert (line.a, line.b) == pytest.approx(expected, rel=1e-9, abs=1e-12), i
        assert line.points == len(points)


def test_a_point_that_is_not_a_number_is_not_kept() -> None:
    line = RobustLine(0.01, 0.0001, 1000.0, 4.0, 8)
    line.add(float("nan"), 1.0)
    line.add(1.0, float("inf"))
    assert line.points == 0
    assert (line.a, line.b) == (0.01, 0.0001)


def test_the_fit_is_made_when_read_not_on_every_observation() -> None:
    """Observations between two reads cost no fit: what is read equals the fit of the
    window as it stands then."""
    rng = random.Random(5)
    lazy = RobustLine(0.01, 0.0001, 1000.0, 4.0, 32)
    eager = RobustLine(0.01, 0.0001, 1000.0, 4.0, 32)
    for _ in range(100):
        x, y = rng.uniform(0, 2000), rng.uniform(0, 1)
        lazy.add(x, y)
        eager.add(x, y)
        eager(0.0)  # read after each observation
    assert (lazy.a, lazy.b) == pytest.approx((eager.a, eager.b), rel=1e-12)


def test_setting_the_intercept_holds_until_the_next_observation() -> None:
    line = RobustLine(0.01, 0.0001, 1000.0, 4.0, 8)
    line.a = 0.005
    assert line(1000.0) == pytest.approx(0.005 + 0.1)
    line.add(1000.0, 0.2)
    assert line.a != 0.005
