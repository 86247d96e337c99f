"""Metric storage written once per event, exposed under several names at scrape time.

The llm-d Router emits each request series twice (its canonical ``llm_d_epp_*`` name
and an older one, often with fewer labels); writing both on every event doubled the
per-request work. Here an event is written once, into plain cells keyed by the label
values that vary (a model, a fairness id, ...), and :class:`OneWrite` renders every
name of a family from those cells when ``/metrics`` is read: each name maps a cell's
key to its own label values, and cells whose keys map to the same values are summed
(how the older names, without ``fairness_id``, come out). The text is what
``prometheus_client``'s Counter, Gauge and Histogram print for the same writes:
``_total`` and ``_created`` samples, cumulative ``le`` buckets ending in ``+Inf``,
``_count``, ``_sum``.

No locks: cells are written and read on the event loop's thread (the admin server
answers ``/metrics`` there)."""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Generic, TypeVar

from prometheus_client.core import Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

_le_text: Callable[[float], str] = floatToGoString  # how prometheus_client prints an le

Key = tuple[str, ...]


class Count:
    """A counter's value for one key."""

    __slots__ = ("created", "value")

    def __init__(self) -> None:
        self.value = 0.0
        self.created = time.time()

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount


class Level:
    """A gauge's value for one key."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self) -> None:
        self.value += 1.0

    def dec(self) -> None:
        self.value -= 1.0


class Buckets:
    """A histogram's observations for one key: how many fell in each bucket (not
    cumulative; the last is ``+Inf``) and their sum."""

    __slots__ = ("bounds", "counts", "created", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.created = time.time()

    def observe(self, value: float) -> None:
        # the first bound >= value: Prometheus buckets count values <= their bound
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value


C = TypeVar("C", Count, Level, Buckets)


class Cells(Generic[C]):
    """One family's cells by key, each made when first written (as a labelled child
    of prometheus_client appears when first used)."""

    def __init__(self, make: Callable[[], C]) -> None:
        self._make: Callable[[], C] = make
        self.cells: dict[Key, C] = {}

    def at(self, key: Key) -> C:
        cell = self.cells.get(key)
        if cell is None:
            cell = self.cells[key] = self._make()
        return cell


@dataclass(frozen=True)
class Name:
    """One name a family is exposed under: its help text, its label names, and the
    label values of the series a cell's key counts into."""

    name: str  # a counter's ends in _total
    doc: str
    labels: Sequence[str]
    values: Callable[[Key], Key]


class OneWrite(Collector):
    """Families written once and exposed under each of their names, in the order
    declared."""

    def __init__(self) -> None:
        self._renders: list[Callable[[], Metric]] = []  # one per name, in order

    def counter(self, *names: Name) -> Cells[Count]:
        cells: Cells[Count] = Cells(Count)
        self._declare(cells, names)
        self._renders.extend(partial(_counter, name, cells.cells) for name in names)
        return cells

    def gauge(self, *names: Name) -> Cells[Level]:
        cells: Cells[Level] = Cells(Level)
        self._declare(cells, names)
        self._renders.extend(partial(_gauge, name, cells.cells) for name in names)
        return cells

    def histogram(self, buckets: Sequence[float], *names: Name) -> Cells[Buckets]:
        bounds = tuple(float(b) for b in buckets)
        cells: Cells[Buckets] = Cells(partial(Buckets, bounds))
        self._declare(cells, names)
        self._renders.extend(partial(_histogram, name, cells.cells) for name in names)
        return cells

    @staticmethod
    def _declare(
        cells: Cells[Count] | Cells[Level] | Cells[Buckets], names: Sequence[Name]
    ) -> None:
        if not any(n.labels for n in names):
            cells.at(())  # an unlabelled family has its one series from the start

    def collect(self) -> Iterator[Metric]:
        for render in self._renders:
            yield render()


def _counter(name: Name, cells: dict[Key, Count]) -> Metric:
    series: dict[Key, list[float]] = {}  # label values -> [value, created]
    for key, cell in list(cells.items()):
        values = name.values(key)
        seen = series.get(values)
        if seen is None:
            series[values] = [cell.value, cell.created]
        else:
            seen[0] += cell.value
            seen[1] = min(seen[1], cell.created)
    base = name.name.removesuffix("_total")
    metric = Metric(base, name.doc, "counter")
    for values, (value, created) in series.items():
        labels = dict(zip(name.labels, values, strict=True))
        metric.add_sample(f"{base}_total", labels, value)
        metric.add_sample(f"{base}_created", labels, created)
    return metric


def _gauge(name: Name, cells: dict[Key, Level]) -> Metric:
    series: dict[Key, float] = {}
    for key, cell in list(cells.items()):
        values = name.values(key)
        series[values] = series.get(values, 0.0) + cell.value
    metric = Metric(name.name, name.doc, "gauge")
    for values, value in series.items():
        metric.add_sample(name.name, dict(zip(name.labels, values, strict=True)), value)
    return metric


def _histogram(name: Name, cells: dict[Key, Buckets]) -> Metric:
    series: dict[Key, Buckets] = {}
    for key, cell in list(cells.items()):
        values = name.values(key)
        seen = series.get(values)
        if seen is None:
            series[values] = seen = Buckets(cell.bounds)
            seen.created = cell.created
        seen.counts = [a + b for a, b in zip(seen.counts, cell.counts, strict=True)]
        seen.sum += cell.sum
        seen.created = min(seen.created, cell.created)
    metric = Metric(name.name, name.doc, "histogram")
    for values, cell in series.items():
        labels = dict(zip(name.labels, values, strict=True))
        running = 0.0
        for bound, count in zip((*cell.bounds, float("inf")), cell.counts, strict=True):
            running += count
            metric.add_sample(f"{name.name}_bucket", {**labels, "le": _le_text(bound)}, running)
        metric.add_sample(f"{name.name}_count", labels, running)
        if not cell.bounds or cell.bounds[0] >= 0:
            metric.add_sample(f"{name.name}_sum", labels, cell.sum)
        metric.add_sample(f"{name.name}_created", labels, cell.created)
    return metric
