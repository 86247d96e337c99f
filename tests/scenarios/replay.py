"""``python -m tests.scenarios.replay SEED [SEED ...]``: run exactly these scenarios
(docs/testing.md) and print what each did; exit 1 if an invariant broke. ``--list``:
only say what each seed draws; ``--epp-from CHECKOUT``: on another checkout's EPP."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from tests.scenarios.eppfrom import OtherCheckout
from tests.scenarios.generate import scenario
from tests.scenarios.verdict import judge


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.scenarios.replay")
    parser.add_argument("seeds", nargs="+", type=int)
    parser.add_argument("--list", action="store_true", help="describe, do not run")
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
    if args.list:
        for seed in args.seeds:
            print(scenario(seed).describe())
        return 0
    failed = 0
    for seed in args.seeds:
        with tempfile.TemporaryDirectory(prefix=f"scenario-{seed}-") as tmp:
            failed += bool(judge(seed, Path(tmp), epp_from))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
