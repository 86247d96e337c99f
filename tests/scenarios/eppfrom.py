"""Scenarios against another checkout's EPP (docs/testing.md, "Against another
checkout"): the harness, Envoy's config and the simulators come from this tree; every
``epp serve`` (and, for the ``stack-replicas`` shape, ``epp stack`` itself, which then
starts that checkout's Envoy config and simulators, as its user ran it) comes from the
other checkout's package and CLI, run by this interpreter with the checkout first on
PYTHONPATH. A flag this tree passes that the other CLI lacks (read from its ``--help``)
is left out, and said once."""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from epp_harness.procs import epp_argv

FLAG = re.compile(r"(?<![\w-])--[A-Za-z0-9][\w-]*")


@functools.cache
def _flags(root: Path, command: str) -> frozenset[str]:
    """Every flag ``epp COMMAND --help`` of the checkout at ``root`` names."""
    done = subprocess.run(
        epp_argv(command, "--help"),
        env={**os.environ, **_env(root)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{root}: `epp {command} --help` failed:\n{done.stderr[-2000:]}")
    return frozenset(FLAG.findall(done.stdout))


def _env(root: Path) -> dict[str, str]:
    """The checkout's package first; PYTHONSAFEPATH keeps ``python -m`` from putting the
    current directory (this tree, when run from its root) before it. Children (workers,
    the simulators of its ``epp stack``) inherit both."""
    return {"PYTHONPATH": str(root), "PYTHONSAFEPATH": "1"}


@dataclass(frozen=True)
class OtherCheckout:
    root: Path
    _said: set[str] = field(default_factory=set, compare=False, hash=False)

    @property
    def env(self) -> dict[str, str]:
        """Added to the environment of the processes that run its ``epp``."""
        return _env(self.root.resolve())

    def adapt(self, argv: Sequence[str]) -> list[str]:
        """``argv`` (the command first, e.g. ``serve``) without the flags that command of
        the other checkout lacks, each with its value where one follows."""
        command, *rest = argv
        known = _flags(self.root.resolve(), command)
        out, skip = [command], False
        for i, arg in enumerate(rest):
            if skip:
                skip = False
                continue
            name = arg.split("=", 1)[0]
            if not arg.startswith("--") or name in known:
                out.append(arg)
                continue
            follows = rest[i + 1] if i + 1 < len(rest) else "--"
            skip = "=" not in arg and not follows.startswith("--")
            if f"{command} {name}" not in self._said:
                self._said.add(f"{command} {name}")
                print(f"{self.root}: `epp {command}` has no {name}: left out", file=sys.stderr)
        return out
