"""``python -m tests.scenarios.replay SEED [SEED ...] [--shape S] [--fault F] [--short]
[--epp-from CHECKOUT]``: run exactly these scenarios (docs/testing.md; the shape and
fault drawn, or pinned) and print what each did; exit 1 if an invariant broke.
``--list``: only say what each seed draws; ``--epp-from CHECKOUT``: on another
checkout's EPP."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from tests.scenarios.eppfrom import OtherCheckout
from tests.scenarios.generate import scenario
from tests.scenarios.model import FAULTS, SHAPES
from tests.scenarios.verdict import judge


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.scenarios.replay")
    parser.add_argument("seeds", nargs="+", type=int)
    parser.add_argument("--list", action="store_true", help="describe, do not run")
    parser.add_argument("--shape", choices=SHAPES, help="pin the shape instead of drawing it")
    parser.add_argument("--fault", choices=FAULTS, help="pin the fault instead of drawing it")
    parser.add_argument("--short", action="store_true", help="cut short, as the fast tier")
    parser.add_argument(
        "--epp-from",
        type=Path,
        metavar="CHECKOUT",
        help="run the EPP (epp serve; epp stack for the stack-replicas shape) of another "
        "checkout of this repository, e.g. an older commit's `git worktree`; the harness, "
        "Envoy's config and the simulators stay this tree's (docs/testing.md)",
    )
    args = parser.parse_args()
    epp_from = None
    if args.epp_from is not None:
        if not (args.epp_from / "epp" / "__main__.py").is_file():
            parser.error(f"--epp-from {args.epp_from}: not a checkout with an epp package")
        epp_from = OtherCheckout(args.epp_from.resolve())
    scenarios = [scenario(seed, args.shape, args.fault, args.short) for seed in args.seeds]
    if args.list:
        for s in scenarios:
            print(s.describe())
        return 0
    failed = 0
    for s in scenarios:
        with tempfile.TemporaryDirectory(prefix=f"scenario-{s.seed}-") as tmp:
            failed += bool(judge(s, Path(tmp), epp_from))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
