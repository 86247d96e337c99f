"""The EPP (package ``epp``) stands apart from its dev harness (``epp_harness``).

Two checks: importing the server module in a fresh interpreter loads no harness module
(nothing this test process already imported can hide one), and no product file has an
import statement naming the harness, including imports deferred into functions, which
the first check cannot see. The one sanctioned reference is by name: ``epp.cli`` looks
the ``sim`` and ``stack`` subcommands up as strings and imports them only when run.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PRODUCT = Path(__file__).resolve().parents[2] / "epp"
HARNESS = "epp_harness"

# Imports the modules named on its command line, then prints the harness modules loaded.
PROBE = f"""
import importlib, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
print("\\n".join(sorted(m for m in sys.modules if m.partition(".")[0] == {HARNESS!r})))
"""


def harness_modules_loaded(*modules: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *modules],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.split()


def harness_imports(source: str) -> list[str]:
    """The harness modules that ``source``'s import statements name."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found += [n for n in names if n.partition(".")[0] == HARNESS]
    return found


def test_importing_the_server_loads_no_harness_module() -> None:
    assert harness_modules_loaded("epp.cli", "epp.serving.serve") == []


def test_the_probe_reports_a_harness_module() -> None:
    assert "epp_harness.procs" in harness_modules_loaded("epp.serving.serve", "epp_harness.procs")


def test_no_product_file_imports_the_harness() -> None:
    offenders = {
        str(path.relative_to(PRODUCT.parent)): found
        for path in sorted(PRODUCT.rglob("*.py"))
        if (found := harness_imports(path.read_text()))
    }
    assert offenders == {}


def test_deferred_and_from_imports_are_found() -> None:
    source = "def f():\n    import epp_harness.stack\n    from epp_harness.sim import cli\n"
    assert harness_imports(source) == ["epp_harness.stack", "epp_harness.sim"]
    assert harness_imports("import epp.serving.serve\nfrom epp import cli\n") == []
