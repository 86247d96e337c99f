"""``python -m tests.scenarios.replay SEED [SEED ...]``: run exactly these scenarios
(docs/testing.md) and print what each did; exit 1 if an invariant broke. ``--list``:
only say what each seed draws."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from tests.scenarios.generate import scenario
from tests.scenarios.verdict import judge


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.scenarios.replay")
    parser.add_argument("seeds", nargs="+", type=int)
    parser.add_argument("--list", action="store_true", help="describe, do not run")
    args = parser.parse_args()
    if args.list:
        for seed in args.seeds:
            print(scenario(seed).describe())
        return 0
    failed = 0
    for seed in args.seeds:
        with tempfile.TemporaryDirectory(prefix=f"scenario-{seed}-") as tmp:
            failed += bool(judge(seed, Path(tmp)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
