"""Measured figures live in bench/results/ only, and no page sends a reader to an issue
number: the rules of tools/figures.py (docs/development.md, *Figures*), checked on the
repository and on small pages that show what the extractor reads and what it leaves."""

from __future__ import annotations

from pathlib import Path

from tools import figures


def test_no_page_copies_a_measured_figure() -> None:
    found = [figures.describe(f) for f in figures.copied()]
    assert found == [], "\n".join(found)


def test_no_user_facing_text_names_an_issue_number() -> None:
    found = figures.issue_numbers()
    assert found == [], "say what the target is and why it matters:\n" + "\n".join(found)


def read(line: str) -> list[tuple[str, str]]:
    return [(f.value, f.unit) for f in figures.figures(line)]


def test_a_figure_is_a_number_with_a_measured_unit_or_two_significant_digits() -> None:
    line = "p90 155 ms, 814ms, 17 µs, 31 us, 0.34x, 2 \N{MULTIPLICATION SIGN}, 9 %, 38.7 req/s"
    assert read(line) == [
        ("155", "ms"),
        ("814", "ms"),
        ("17", "µs"),
        ("31", "µs"),
        ("0.34", "x"),
        ("2", "x"),
        ("9", "%"),
        ("38.7", "req/s"),
    ]
    # a time needs two significant digits too (a round 5 ms is a target, not a reading)
    assert read("7 µs and 5 ms") == []
    # settings: sizes and other units, a load, a bound
    assert read("20 s, 1 MiB, 2.5 hours, at 70 %, 95 % load, within 10 %, ≤ 0.5x") == []
    # bare (read in a table cell of figures): two significant digits or more
    assert read("1,016 and 0.95 and 44.4; not 4, 20, 1,000") == [
        ("1016", ""),
        ("0.95", ""),
        ("44.4", ""),
    ]


def test_a_range_or_a_list_gives_its_unit_to_every_number() -> None:
    assert read("5-18 %, 0.19 / 0.66x, 189 vs 171 ms, 814 to 155 ms") == [
        ("5", "%"),
        ("18", "%"),
        ("0.19", "x"),
        ("0.66", "x"),
        ("189", "ms"),
        ("171", "ms"),
        ("814", "ms"),
        ("155", "ms"),
    ]


def test_names_dates_versions_and_commits_are_not_figures() -> None:
    line = "p90 kv1.6 x86_64 2P:2D H100 at 3ee56ed, 2026-11-24 14:49 UTC, Envoy 1.40.0"
    assert read(line) == []


def test_code_links_defaults_tables_and_the_marker_are_exempt() -> None:
    page = "\n".join(
        [
            "Quoted: `--stream-chunk-timeout 155 ms` and [155 ms](../bench/results/x.md).",
            "```",
            "p90 155 ms",
            "```",
            "| key | default |",
            "|---|---|",
            "| `timeout` | 155 ms |",
            "",
            "A target of 155 ms, equal by chance. " + figures.MARKER,
            "<!-- 155 ms -->",
            "but this one counts: 155 ms",
        ]
    )
    assert [(n, f.value) for n, f in figures.page_figures(page)] == [(1, "155"), (11, "155")]


def test_a_page_table_of_figures_is_read_and_prose_counts_are_not() -> None:
    page = "\n".join(
        [
            "16 groups of 1,500-token prompts, 404 when unknown.",
            "",
            "| policy | p90 ms | warm misses | note |",
            "|---|---|---|---|",
            "| default | 176 / 173 | 31 / 35 | 16 groups, 1,500 tokens |",
            "",
            "| status | when |",
            "|---|---|",
            "| 429 | 20 requests waiting |",
        ]
    )
    read_back = [(n, f.value, f.unit) for n, f in figures.page_figures(page)]
    assert read_back == [(5, "176", "ms"), (5, "173", "ms"), (5, "31", "?"), (5, "35", "?")]


def test_a_result_table_cell_takes_its_unit_from_the_header() -> None:
    held = figures.result_figures(
        "Setting: 20 requests, 1.6 copies.\n\n"
        "| policy | TTFT p90 ms | loads / 100 req | hit % |\n| --- | ---: | ---: | ---: |\n"
        "| round-robin | 124 | 65.1 | 47.3 |\n"
    )
    assert held == {("124", "ms"), ("65.1", "?"), ("47.3", "%")}
    assert figures.holds(held, figures.Figure("124", "ms", "124 ms"))
    assert not figures.holds(held, figures.Figure("124", "µs", "124 µs"))
    assert figures.holds(held, figures.Figure("65.1", "%", "65.1 %"))  # no unit: any
    assert not figures.holds(held, figures.Figure("1.6", "", "1.6"))  # prose: settings


def test_the_check_names_page_line_number_and_result_file(tmp_path: Path) -> None:
    (tmp_path / "bench" / "results").mkdir(parents=True)
    (tmp_path / "bench" / "results" / "fairness.md").write_text(
        "| case | B p90 ms |\n|---|---:|\n| flood | 155 |\n"
    )
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "flow.md").write_text(
        "# Flow\n\nThe light tenant's p90 is 155 ms with it ([fairness](x.md)).\n"
        "See issue 18 and issue #13.\n"
    )
    assert [figures.describe(f) for f in figures.copied(tmp_path)] == [
        "docs/flow.md:3: '155 ms' is a measured figure held by bench/results/fairness.md: "
        "link to it instead of quoting the number"
    ]
    assert figures.issue_numbers(tmp_path) == [
        "docs/flow.md:4: issue 18",
        "docs/flow.md:4: issue #13",
    ]
