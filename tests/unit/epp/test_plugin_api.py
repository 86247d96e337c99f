"""The public plugin API: plugin packages import from epp.plugin only, and that package
only re-exports names that resolve."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import epp.plugin

ROOT = Path(__file__).resolve().parents[3]
PUBLIC = "epp.plugin"
PLUGIN_DOCS = [ROOT / "docs" / "extending.md", ROOT / "docs" / "plugins.md"]
TINY_PLUGIN = ROOT / "tests" / "support" / "tiny_plugin" / "epp_tiny.py"


def _python_blocks(markdown: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", markdown, flags=re.M | re.S)


def _epp_imports(source: str) -> list[str]:
    """The epp modules ``source`` imports (``import epp.x``, ``from epp.x import y``)."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] == "epp"]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [node.module] if node.module.split(".")[0] == "epp" else []
    return found


def test_extending_md_examples_import_only_the_public_package() -> None:
    text = (ROOT / "docs" / "extending.md").read_text()
    blocks = _python_blocks(text)
    assert blocks, "docs/extending.md has no python example"
    imported = [m for block in blocks for m in _epp_imports(block)]
    assert PUBLIC in imported  # the example does import the EPP
    assert [m for m in imported if m != PUBLIC] == []


@pytest.mark.parametrize("doc", PLUGIN_DOCS, ids=lambda p: p.name)
def test_plugin_docs_examples_import_nothing_internal(doc: Path) -> None:
    imported = [m for block in _python_blocks(doc.read_text()) for m in _epp_imports(block)]
    assert [m for m in imported if m != PUBLIC] == []


def test_the_example_plugin_package_imports_only_the_public_package() -> None:
    """docs/extending.md abridges this file: the whole package needs nothing else."""
    imported = _epp_imports(TINY_PLUGIN.read_text())
    assert imported == [PUBLIC]


def test_every_public_name_resolves_to_an_object_defined_elsewhere() -> None:
    names = epp.plugin.__all__
    assert len(names) == len(set(names))
    for name in names:
        obj = getattr(epp.plugin, name)  # AttributeError: a name that does not resolve
        home = getattr(obj, "__module__", None)  # re-exported, not defined here
        assert home is not None and home != PUBLIC and home.startswith("epp."), (name, home)


def test_the_public_package_only_re_exports() -> None:
    """Its module holds a docstring, imports from epp and ``__all__``: nothing else, so
    importing it runs no code of its own."""
    tree = ast.parse(Path(epp.plugin.__file__).read_text())
    body = tree.body
    assert isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
    for node in body[1:]:
        if isinstance(node, ast.ImportFrom):
            assert node.module is not None and node.module.startswith("epp."), node.module
        else:
            assert isinstance(node, ast.Assign), ast.dump(node)
            assert [t.id for t in node.targets if isinstance(t, ast.Name)] == ["__all__"]
    imported = {a.asname or a.name for n in body if isinstance(n, ast.ImportFrom) for a in n.names}
    assert imported == set(epp.plugin.__all__)  # everything imported is exported
