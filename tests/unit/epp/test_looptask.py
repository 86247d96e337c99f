"""A periodic task keeps running past a step that raises, and says so in the log."""

from __future__ import annotations

import asyncio
import logging

import pytest

from epp.common import looptask


async def test_every_outlives_a_failing_step(caplog: pytest.LogCaptureFixture) -> None:
    calls: list[int] = []
    third = asyncio.Event()

    async def step() -> None:
        calls.append(len(calls))
        if len(calls) == 1:
            raise RuntimeError("boom")
        if len(calls) == 3:
            third.set()

    log = logging.getLogger("test.looptask")
    task = looptask.every("checking things", 0, step, log)
    with caplog.at_level(logging.ERROR, logger="test.looptask"):
        task.start()
        await third.wait()
        await task.stop()
    assert len(calls) >= 3
    (record,) = caplog.records
    assert record.getMessage() == "checking things failed; trying again next time"
    assert record.exc_info is not None and "boom" in str(record.exc_info[1])
