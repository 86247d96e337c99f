"""epp.common.lazymodule: a module named now and imported on its first attribute read."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from epp.common.lazymodule import lazy_module


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A real package on sys.path, ``lazyprobe`` with a submodule ``sub``, that nothing
    has imported yet; forgotten again after the test."""
    root = tmp_path / "lazyprobe"
    root.mkdir()
    (root / "__init__.py").write_text("VALUE = 1\n")
    (root / "sub.py").write_text("def twice(x):\n    return 2 * x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "lazyprobe"
    for name in ("lazyprobe", "lazyprobe.sub"):
        sys.modules.pop(name, None)


def test_nothing_is_imported_until_an_attribute_is_read(package: str) -> None:
    module = lazy_module(package, f"{package}.sub")
    assert package not in sys.modules
    assert module.VALUE == 1
    assert package in sys.modules
    assert module.sub.twice(3) == 6  # the submodule came with it


def test_after_the_first_read_attributes_are_its_own(package: str) -> None:
    """Read without a lookup through the import system each time (hot paths use them)."""
    module = lazy_module(package)
    assert "VALUE" not in module.__dict__
    assert module.VALUE == 1
    assert module.__dict__["VALUE"] == 1


def test_a_missing_module_fails_where_it_is_used_not_where_it_is_named() -> None:
    module = lazy_module("no_such_module_here")
    with pytest.raises(ModuleNotFoundError, match="no_such_module_here"):
        _ = module.anything


def test_a_missing_attribute_is_an_attribute_error(package: str) -> None:
    module = lazy_module(package)
    with pytest.raises(AttributeError, match="nothing"):
        _ = module.nothing
