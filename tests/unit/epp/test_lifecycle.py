"""epp.serving.lifecycle: parts start in order and stop in reverse, also when one fails."""

from __future__ import annotations

import pytest

from epp.serving import lifecycle
from epp.serving.lifecycle import App, Step


async def test_parts_start_in_order_and_stop_in_reverse_also_on_failure() -> None:
    events: list[str] = []

    def step(name: str, fail: bool = False) -> Step:
        def start() -> None:
            events.append(f"start {name}")
            if fail:
                raise OSError(f"{name} cannot start")

        async def stop() -> None:
            events.append(f"stop {name}")

        return Step(name, start, stop)

    app = App([step("a"), step("b"), step("c", fail=True), step("d")])
    with pytest.raises(OSError, match="c cannot start"):
        await lifecycle.run(app)
    assert events == ["start a", "start b", "start c", "stop b", "stop a"]
