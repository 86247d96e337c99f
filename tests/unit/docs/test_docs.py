"""The docs stay true to the code and to each other: the generated pages equal what
their generators write now, the README stays a front door, and every relative link
(file and #anchor) in the README and docs/ resolves."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench import results_index
from tools import docsgen

ROOT = Path(__file__).resolve().parents[3]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
LINKED = [README, *DOCS, results_index.INDEX]

FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: link text kept, lower case, punctuation dropped
    (hyphens and underscores stay), spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for heading in HEADING.findall(FENCE.sub("", path.read_text())):
        base = slug(heading)
        n = seen.get(base, 0)
        found.add(base if n == 0 else f"{base}-{n}")
        seen[base] = n + 1
    return found


def links(path: Path) -> list[str]:
    text = CODE.sub("", FENCE.sub("", path.read_text()))
    return LINK.findall(text)


def broken(path: Path, root: Path = ROOT) -> list[str]:
    problems = []
    for target in links(path):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            problems.append(f"{target}: no such file")
        elif not dest.is_relative_to(root):
            problems.append(f"{target}: outside the repository")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{target}: no heading #{anchor} in {dest.relative_to(root)}")
    return problems


@pytest.mark.parametrize("path", LINKED, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_resolves(path: Path) -> None:
    assert broken(path) == []


def test_the_link_checker_catches_what_it_should(tmp_path: Path) -> None:
    (tmp_path / "b.md").write_text("# Title\n\n## `epp sidecar` — a P/D proxy\n\n## Title\n")
    page = tmp_path / "a.md"
    page.write_text(
        "[ok](b.md#epp-sidecar--a-pd-proxy) [dup](b.md#title-1) [web](https://x.y/z)\n"
        "`[in code](nowhere.md)`\n```\n[fenced](nowhere.md)\n```\n"
        "[gone](c.md) [bad anchor](b.md#nope) [self](#missing)\n"
    )
    assert broken(page, tmp_path) == [
        "c.md: no such file",
        "b.md#nope: no heading #nope in b.md",
        "#missing: no heading #missing in a.md",
    ]


def test_readme_is_a_front_door() -> None:
    assert len(README.read_text().splitlines()) <= 250


def test_generated_docs_are_current() -> None:
    for path, text in docsgen.expected().items():
        assert path.read_text() == text, f"run: python -m tools.docsgen ({path.name})"


def test_benchmark_index_is_current() -> None:
    assert results_index.INDEX.read_text() == results_index.render(), (
        "run: python -m bench.results_index"
    )


def test_no_doc_cites_a_file_outside_the_repository() -> None:
    """What the project relies on from its design notes is in docs/architecture.md."""
    sources = [*LINKED, *ROOT.glob("epp/**/*.py"), *ROOT.glob("epp_harness/**/*.py")]
    sources += ROOT.glob("tests/**/*.py")
    sources += [*ROOT.glob("bench/*.py"), *ROOT.glob("tools/*.py")]
    citing = [
        str(p.relative_to(ROOT))
        for p in sources
        if p != Path(__file__).resolve() and "DESIGN" + ".md" in p.read_text()
    ]
    assert citing == []


def test_the_layers_drawing_follows_the_contract() -> None:
    """docs/architecture.md draws the floors of pyproject.toml's layers contract, in its
    order (the contract is the one place they are written)."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    floors = next(c["layers"] for c in contracts if c["type"] == "layers")
    text = (ROOT / "docs" / "architecture.md").read_text()
    drawing = text[text.index("## Layers") : text.index("## Layout")]
    # the drawing wraps long floors: compare the module names, floor by floor, in order
    names = re.findall(r"(?m)^ {4,6}(\w[\w :|]*?)(?: {2,}|$)", drawing)
    drawn = " ".join(names).split()
    expected = " ".join(floors).split()
    assert [w for w in drawn if w not in "|:"] == [w for w in expected if w not in "|:"]
