"""Run one seed and judge it: the violations, and a report that names the seed and the
one command that replays exactly that scenario."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from tests.scenarios.eppfrom import OtherCheckout
from tests.scenarios.generate import scenario
from tests.scenarios.invariants import violations
from tests.scenarios.model import Run, Scenario
from tests.scenarios.run import run_seed


def summary(run: Run) -> str:
    kinds = Counter(
        "ok" if o.complete else "hung up" if o.hung_up else "injected" if o.injected
        else f"refused {o.status} {o.dropped}" if o.dropped
        else f"status {o.status}" + (" (cut)" if o.body else "")
        for o in run.outcomes
    )  # fmt: skip
    served = Counter(o.served or "-" for o in run.outcomes)
    events = ", ".join(f"{e.what} on {e.victim}" for e in run.events) or "no fault"
    return f"outcomes {dict(kinds)}; served by {dict(served)}; {events}"


def report(s: Scenario, run: Run, found: list[str], epp_from: OtherCheckout | None) -> str:
    replay = s.replay() + (f" --epp-from {epp_from.root}" if epp_from else "")
    lines = [
        f"scenario {s.describe()}" + (f" (the EPP of {epp_from.root})" if epp_from else ""),
        f"replay: {replay}",
        summary(run),
        *found[:20],
    ]
    if len(found) > 20:
        lines.append(f"... and {len(found) - 20} more")
    return "\n".join(lines)


def judge(seed: int | Scenario, tmp: Path, epp_from: OtherCheckout | None = None) -> str:
    """Run the scenario of ``seed`` (or the scenario given, e.g. one with its shape and
    fault pinned; ``epp_from``: on another checkout's EPP); "" when every invariant
    holds, else the report."""
    s = scenario(seed) if isinstance(seed, int) else seed
    run = run_seed(s, tmp, epp_from)
    found = violations(run)
    verdict = report(s, run, found, epp_from) if found else ""
    print(verdict or f"ok: {s.describe()}; {summary(run)}")
    return verdict
