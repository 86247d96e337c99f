"""The wheel's metadata says what the code needs: every distribution that `epp` and
`epp_harness` import is a declared dependency, and the build backend understands the
metadata the project file uses."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _declared() -> set[str]:
    deps = PROJECT["project"]["dependencies"]
    return {_normal(re.split(r"[<>=!~;\[ ]", d, maxsplit=1)[0]) for d in deps}


def _imported_top_levels() -> set[str]:
    names: set[str] = set()
    for package in ("epp", "epp_harness"):
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names.update(a.name.split(".")[0] for a in node.names)
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names) - {"epp", "epp_harness"}


def test_every_imported_distribution_is_declared() -> None:
    providers = importlib.metadata.packages_distributions()
    declared = _declared()
    missing = {
        name: providers.get(name)
        for name in _imported_top_levels()
        # a namespace (google, envoy) shipped by several: one declared one is enough
        if not any(_normal(d) in declared for d in providers.get(name, []))
    }
    assert not missing, f"imported but not in [project].dependencies: {missing}"


def test_the_license_is_shipped_and_the_backend_reads_its_metadata() -> None:
    assert PROJECT["project"]["license"] == "Apache-2.0"
    assert (ROOT / "LICENSE").read_text().lstrip().startswith("Apache License")
    assert PROJECT["project"]["license-files"] == ["LICENSE"]
    # an SPDX string `license` and `license-files` need setuptools 77 (PEP 639)
    assert PROJECT["build-system"]["requires"] == ["setuptools>=77"]
    assert "LICENSE" in (ROOT / "Dockerfile").read_text().split("COPY pyproject.toml", 1)[1]
