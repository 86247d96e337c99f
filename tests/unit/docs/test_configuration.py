"""docs/configuration.md holds the built-in default exactly as `epp config show` prints
it (regenerate: .venv/bin/python -m epp.serving.configcmd --write-docs docs/configuration.md)."""

from __future__ import annotations

import shutil
from pathlib import Path

from epp import config
from epp.serving import configcmd

DOC = Path(__file__).resolve().parents[3] / "docs" / "configuration.md"


def test_the_docs_copy_of_the_default_config_is_current() -> None:
    assert configcmd.docs_block(DOC.read_text()) == configcmd.show(config.load(None)), (
        f"{DOC} is stale: run `.venv/bin/python -m epp.serving.configcmd --write-docs "
        "docs/configuration.md`"
    )


def test_write_docs_replaces_only_the_block(tmp_path: Path) -> None:
    doc = tmp_path / "c.md"
    shutil.copy(DOC, doc)
    text = DOC.read_text()
    doc.write_text(text.replace("kind: EndpointPickerConfig", "kind: Stale"))
    assert configcmd.write_docs(doc)
    assert doc.read_text() == text
    bare = tmp_path / "bare.md"
    bare.write_text("# no markers\n")
    assert not configcmd.write_docs(bare)
    assert bare.read_text() == "# no markers\n"
