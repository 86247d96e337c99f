"""One ``epp top`` screen from a :class:`~epp.top.frame.Frame`: a header with the pool's
totals and a table with a row per endpoint (``rich`` renderables, drawn by the caller)."""

from __future__ import annotations

from typing import Literal

from rich.console import Group
from rich.table import Table
from rich.text import Text

from epp.top.frame import EndpointRow, Frame

STATE_STYLES = {"healthy": "green", "waiting": "yellow", "ejected": "red", "draining": "magenta"}
NONE = "-"


def render(frame: Frame, source: str, note: str = "") -> Group:
    """``source``: what is watched (the URL); ``note``: the last line (keys, an error)."""
    pool = frame.pool
    window = f"{frame.window_s:.1f} s" if frame.window_s is not None else "first sample"
    header = Text.assemble(
        ("epp top", "bold"),
        f"  {source}  (rates over {window})\n",
        f"endpoints {pool.endpoints} ({pool.healthy} healthy)   in flight {pool.in_flight}   ",
        f"requests {_rate(pool.rate)}   errors {_rate(pool.errors)}   ",
        f"TTFT p90 {_ms(pool.ttft_p90_s)}   scheduling {_mean(pool.scheduling_ms)}",
    )
    table = Table(box=None, header_style="bold", pad_edge=False)
    for name, justify in COLUMNS:
        table.add_column(name, justify=justify, no_wrap=True)
    for row in frame.endpoints:
        table.add_row(*_cells(row))
    if not frame.endpoints:
        table.add_row("(no endpoints)", *[""] * (len(COLUMNS) - 1))
    return Group(header, Text(""), table, Text(""), Text(note, style="dim"))


COLUMNS: tuple[tuple[str, Literal["left", "right"]], ...] = (
    ("ENDPOINT", "left"),
    ("ROLE", "left"),
    ("STATE", "left"),
    ("QUEUE", "right"),
    ("RUNNING", "right"),
    ("KV", "right"),
    ("IN FLIGHT", "right"),
    ("REQ/S", "right"),
    ("ERR/S", "right"),
    ("PREFIX HIT", "right"),
)


def _cells(row: EndpointRow) -> tuple[str | Text, ...]:
    name = row.address if row.name is None else f"{row.address} ({row.name})"
    return (
        name,
        row.role,
        Text(row.state, style=STATE_STYLES.get(row.state, "")),
        _count(row.waiting),
        _count(row.running),
        _percent(row.kv_usage),
        str(row.in_flight),
        _number(row.rate),
        _number(row.errors),
        _percent(row.hit_rate),
    )


def _number(value: float | None) -> str:
    return NONE if value is None else f"{value:.1f}"


def _rate(value: float | None) -> str:
    return NONE if value is None else f"{value:.1f}/s"


def _count(value: float | None) -> str:
    return NONE if value is None else f"{value:g}"


def _percent(value: float | None) -> str:
    return NONE if value is None else f"{100 * value:.0f}%"


def _ms(seconds: float | None) -> str:
    return NONE if seconds is None else f"{1000 * seconds:.0f} ms"


def _mean(ms: float | None) -> str:
    return NONE if ms is None else f"{ms:.2f} ms (mean)"
