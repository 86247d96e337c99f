"""Measured figures live in ``bench/results/`` only: this finds the pages that copy one.

A *figure* is a number a reader would take for a measurement: one with a unit that
measurements come in (``ms``, ``µs``, ``%``, a ratio such as ``0.34x``, a rate such as
``req/s``; a time with at least two significant digits), or a bare number in a table
cell that holds figures only (``| 176 / 173 |``). A range or a list gives its last unit
to each of its numbers (``5-18 %``). A page outside ``bench/results/`` *copies* a figure
when a result page holds the same value with the same unit; a number in a result table
takes its unit from the column's header, and one whose header names none matches any
unit. Only figures with a unit are read from a result page's prose.

Not read as figures (the rule docs/development.md states, for the pages a reader meets):

- fenced code blocks and inline code (quoted command output, flags, config values);
- link targets, HTML comments, dates, times, versions, commit ids and names that carry
  digits (``p90``, ``kv1.6``, ``2P:2D``);
- seconds, sizes and other units (settings and sizes, not measurements), a share of
  capacity (``70 % load``, ``at 95 %``), a bound or target (``within 10 %``,
  ``<= 1.2x``), a tolerance (``±20 %``), a product (``2 x 32 layers``);
- a bare number in prose (a count, a setting, a status code: too alike to tell apart);
- a table of defaults (a column named ``default``) or a ``status`` column;
- a line that ends with the marker ``<!-- not-a-result -->`` (a number that equals a
  result by coincidence); keep it rare.

``python -m tools.figures`` lists every copied figure and every issue number a reader
would meet (exit 1 if any); ``tests/unit/docs/test_figures.py`` runs the same checks in
``make test``.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARKER = "<!-- not-a-result -->"
ANY_UNIT = "?"  # a result table cell whose header names no unit

# The pages a reader meets outside bench/results/.
PAGES = ["README.md", "docs/*.md", "deploy/**/*.md"]
# Where "issue N" must not appear: the pages above, the Makefile, the benchmarks'
# scripts (their texts end up in result pages and help output) and the result pages.
NO_ISSUE_NUMBERS = [*PAGES, "Makefile", "bench/*.py", "bench/results/*.md"]
ISSUE = re.compile(r"\bissues? #?\d+", re.I)

FENCE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1[^\n]*$", re.S | re.M)
COMMENT = re.compile(r"<!--.*?-->", re.S)
# What is blanked before numbers are read: inline code, link targets, dates, times,
# versions, commit ids, and words that contain digits (p90, kv1.6, x86_64, 2P:2D, H100).
NOISE = [
    re.compile(r"`[^`\n]*`"),
    re.compile(r"\]\([^)\s]*\)"),
    re.compile(r"https?://\S+"),
    re.compile(r"\b\d{4}-\d{2}-\d{2}\b"),
    re.compile(r"\b\d{1,2}:\d{2}(?::\d{2})?\b"),
    re.compile(r"\bv?\d+\.\d+\.\d+\S*"),
    re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b"),
    re.compile(r"\b\d+[A-Za-z]:\d+[A-Za-z]\b"),
    re.compile(r"[A-Za-z_][\w.-]*\d[\w]*(?:\.\d+)*"),
    re.compile(r"\b\d+(?!(?:ms|us|µs|s|x|KB|MB|GB|KiB|MiB|GiB|min)\b)[A-Za-z_]\w*"),
]
TIMES = "\N{MULTIPLICATION SIGN}"
NUMBER = re.compile(
    r"(?<![\w.,/])[+\-\N{MINUS SIGN}±~]?(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?(?![\w,/]\d|\.\d)"
)
# A unit right after the number. A ratio is 0.34x or 2 x, not a product (2 x 32 layers,
# 2 x (B alone + ...)).
UNIT = re.compile(
    r"\s?(?P<unit>µs\b|us\b|ms\b|%|[x" + TIMES + r"](?!\w|\s*[\w(])|[a-z]+/s\b|s\b"
    r"|min\b|minutes?\b|seconds?\b|hours?\b|KB\b|MB\b|GB\b|KiB\b|MiB\b|GiB\b)"
)
UNIT_NAMES = {"us": "µs", TIMES: "x", "seconds": "s", "second": "s", "minutes": "min"}
UNIT_NAMES |= {"minute": "min", "hour": "hours"}
# Between two numbers of a range or list that share the last one's unit (5-18 %).
JOINER = re.compile(r"\s*(?:-|\N{EN DASH}|to|/|or|and|vs\.?|against|,|, or|, and)\s*")
RATIOS = {"%", "x"}  # figures even with one significant digit (9 %, 2x)
# Units that measurements come in; a number with another unit (20 s, 1 MiB, 2.5 hours)
# is a setting or a size, not read as a figure.
MEASURED = RATIOS | {"ms", "µs"}  # and every rate of things: req/s, tok/s, blocks/s
# A share of capacity is the load a benchmark was run at, a setting (70 % load).
SETTING = re.compile(r"\s*(?:load|of (?:its |the pool's |round robin's )?capacity)\b")
# A bound is a target or a limit, not a measurement (within 10 %, at most 1/3, ≤ 5 ms);
# a percentage after "at" is the load a cell ran at (at 95 %).
BOUND = re.compile(r"(?:\bat most|\bat least|\bwithin|\bbelow|\bunder|[≤≥<>]=?)\s*$", re.I)
UNIT_WORDS = re.compile(r"µs|us|ms|[A-Za-z]+/s\b")
TABLE_UNIT = re.compile(r"(µs|ms|%|req/s|tok/s|\bs\b)\W*$")


@dataclass(frozen=True)
class Figure:
    value: str  # normalised: 1,500.0 -> "1500"
    unit: str  # "" for a bare number
    text: str  # as written


@dataclass(frozen=True)
class Found:
    page: str
    line: int
    figure: Figure
    result: str


def normalise(digits: str) -> str:
    return format(Decimal(digits.replace(",", "")).normalize(), "f")


def measured(unit: str) -> bool:
    return unit in MEASURED or unit.endswith("/s")


def significant(digits: str) -> int:
    plain = digits.replace(",", "")
    if "." in plain:
        return len(plain.replace(".", "").lstrip("0"))
    return len(plain.lstrip("0").rstrip("0"))


def clean(line: str) -> str:
    for pattern in NOISE:
        line = pattern.sub(lambda m: " " * len(m[0]), line)
    return line


def figures(line: str) -> list[Figure]:
    """The figures one line of prose holds, a range's unit given to each of its ends."""
    text = clean(line)
    found: list[tuple[int, int, str, str]] = []  # start, end, digits, unit
    for m in NUMBER.finditer(text):
        digits = m[1] + (m[2] or "")
        u = UNIT.match(text, m.end())
        unit = UNIT_NAMES.get(u["unit"], u["unit"]) if u else ""
        if u and SETTING.match(text, u.end()):
            continue
        before = text[: m.start()]
        if (
            m[0].startswith("±")
            or BOUND.search(before)
            or (unit == "%" and re.search(r"\bat\s*$", before))
        ):
            continue
        found.append((m.start(), u.end() if u else m.end(), digits, unit))
    # A number joined to the next one by "-", "to", "/", "or" takes its unit (5-18 %).
    for i in range(len(found) - 2, -1, -1):
        start, end, digits, unit = found[i]
        after = found[i + 1]
        if not unit and after[3] and JOINER.fullmatch(text[end : after[0]]):
            found[i] = (start, end, digits, after[3])
    return [
        Figure(normalise(digits), unit, line[start:end].strip())
        for start, end, digits, unit in found
        if unit in RATIOS or ((measured(unit) or not unit) and significant(digits) >= 2)
    ]


def prose(text: str) -> Iterator[tuple[int, str]]:
    """(line number, line) of a page, with code blocks and comments blanked."""
    blank = FENCE.sub(lambda m: "\n" * m[0].count("\n"), text)
    blank = COMMENT.sub(lambda m: "\n" * m[0].count("\n"), blank)
    yield from enumerate(blank.split("\n"), 1)


def cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def page_figures(text: str) -> Iterator[tuple[int, Figure]]:
    """The figures a page outside bench/results quotes, with their line numbers."""
    raw = text.split("\n")
    header: list[str] = []
    for number, line in prose(text):
        if raw[number - 1].rstrip().endswith(MARKER):
            continue
        if line.lstrip().startswith("|"):
            if re.fullmatch(r"[\s|:-]+", line):
                continue
            if not header:
                header = cells(line)
                continue
            if any(h.lower().startswith("default") for h in header):
                continue
            for i, cell in enumerate(cells(line)):
                m = TABLE_UNIT.search(header[i]) if i < len(header) else None
                numeric = not re.search(r"[^\W\dx]", UNIT_WORDS.sub("", clean(cell)))
                numeric = numeric and not (i < len(header) and header[i].lower() == "status")
                for f in figures(cell):
                    # a bare number in a cell of figures only is one (p90 | 176 / 173)
                    unit = f.unit or (m[1] if m else ANY_UNIT) if numeric else f.unit
                    if unit:
                        yield number, Figure(f.value, unit, f.text)
            continue
        header = []
        for figure in figures(line):
            if figure.unit:  # a bare number in prose is a count, a setting, a status
                yield number, figure


def result_figures(text: str) -> set[tuple[str, str]]:
    """(value, unit) of every figure a result page holds; a table cell takes the unit
    its column's header names, or matches any unit when the header names none."""
    held: set[tuple[str, str]] = set()
    header: list[str] = []
    for _, line in prose(text):
        if line.lstrip().startswith("|"):
            if re.fullmatch(r"[\s|:-]+", line):
                continue
            if not header:
                header = cells(line)
            else:
                for i, cell in enumerate(cells(line)):
                    m = TABLE_UNIT.search(header[i]) if i < len(header) else None
                    for f in figures(cell):
                        unit = f.unit or (m[1] if m else ANY_UNIT)
                        held.add((f.value, unit))
                continue
        else:
            header = []
        held.update((f.value, f.unit) for f in figures(line) if f.unit)
    return held


def holds(held: set[tuple[str, str]], figure: Figure) -> bool:
    """A result holds the figure: the same value with the same unit, or in a result
    table's cell whose header names no unit (then the page's unit is taken for it). A
    bare number in a page's table of figures matches the value with any unit."""
    if figure.unit == ANY_UNIT:
        return any(value == figure.value for value, _ in held)
    return (figure.value, figure.unit) in held or (figure.value, ANY_UNIT) in held


def pages(patterns: Iterable[str], root: Path = ROOT) -> list[Path]:
    return sorted({p for pattern in patterns for p in root.glob(pattern) if p.is_file()})


def copied(root: Path = ROOT) -> list[Found]:
    """Every figure a page outside bench/results quotes that a result page holds."""
    results = {
        p.name: result_figures(p.read_text())
        for p in sorted((root / "bench" / "results").glob("*.md"))
    }
    out: list[Found] = []
    for page in pages(PAGES, root):
        for line, figure in page_figures(page.read_text()):
            for name, held in results.items():
                if holds(held, figure):
                    out.append(Found(str(page.relative_to(root)), line, figure, name))
                    break
    return out


def issue_numbers(root: Path = ROOT) -> list[str]:
    """'PAGE:LINE: issue N' for every issue number a reader would meet."""
    out = []
    for page in pages(NO_ISSUE_NUMBERS, root):
        for number, line in enumerate(page.read_text().split("\n"), 1):
            out += [f"{page.relative_to(root)}:{number}: {m[0]}" for m in ISSUE.finditer(line)]
    return out


def describe(found: Found) -> str:
    return (
        f"{found.page}:{found.line}: {found.figure.text!r} is a measured figure held by "
        f"bench/results/{found.result}: link to it instead of quoting the number"
    )


def main() -> int:
    problems = [describe(f) for f in copied()] + issue_numbers()
    print("\n".join(problems))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
