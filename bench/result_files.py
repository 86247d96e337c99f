"""What the benchmarks' result files share: a report's header and list of policies, and
writing ``NAME.json`` with ``NAME.md`` beside it."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def run_header(title: str, meta: Mapping[str, Any], client: str = "") -> list[str]:
    """A report's title, its note in bold, when and where it ran, and its command."""
    lines = [f"# {title}", ""]
    if meta.get("note"):
        lines += [f"**{meta['note']}**", ""]
    using = f", with {client}" if client else ""
    return [
        *lines,
        f"Measured {meta['date']} on {meta['machine']}, code at {meta['git']}{using}, in "
        f"{meta['elapsed_s']:.0f} s:",
        "",
        f"    {meta['command']}",
        "",
    ]


def policy_lines(descriptions: Mapping[str, str]) -> list[str]:
    """A report's "Policies:" list, one line per policy name and its description."""
    return ["Policies:", "", *[f"- `{name}`: {text}" for name, text in descriptions.items()]]


def write_pair(out: Path, name: str, doc: dict[str, Any], markdown: str) -> None:
    """``out/NAME.json`` (``doc``, indented) and ``out/NAME.md``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(doc, indent=1) + "\n")
    (out / f"{name}.md").write_text(markdown)
