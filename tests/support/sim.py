"""Simulator processes for tests: start several at once, post to them, read their
counters (``/sim/stats``) and metrics."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from epp_harness.procs import ManagedProcess, spawn_epp
from tests.support.http import get_json, metric_sum, request


@dataclass
class SimProc:
    proc: ManagedProcess

    @property
    def url(self) -> str:
        url: str = self.proc.info["url"]
        return url

    @property
    def port(self) -> int:
        port: int = self.proc.info["port"]
        return port

    def post(
        self, path: str, doc: dict[str, Any], rid: str | None = None, timeout: float = 30.0
    ) -> tuple[int, bytes]:
        headers = {"x-request-id": rid} if rid else {}
        status, _, body = request(f"{self.url}{path}", orjson.dumps(doc), headers, timeout=timeout)
        return status, body

    def stats(self) -> dict[str, Any]:
        stats: dict[str, Any] = get_json(f"{self.url}/sim/stats")
        return stats

    def metric(self, name: str) -> float:
        _, _, body = request(f"{self.url}/metrics")
        return metric_sum(body.decode(), name)


@contextmanager
def sims(workdir: Path, *arg_lists: Sequence[str]) -> Iterator[list[SimProc]]:
    """Start one ``epp sim --port 0`` per argument list, in parallel; stop them after and
    check that none logged a traceback."""
    procs = [
        spawn_epp(workdir, f"sim-{i}", "sim", "--port", "0", *args)
        for i, args in enumerate(arg_lists)
    ]
    try:
        for p in procs:
            p.wait_ready()
        yield [SimProc(p) for p in procs]
        for p in procs:
            assert "Traceback" not in p.log_tail(1000), p.log_tail(1000)
    finally:
        for p in procs:
            p.terminate()  # all at once, then each waited for
        for p in procs:
            p.stop()


def completion(prompt: str, **fields: Any) -> dict[str, Any]:
    return {"model": "sim-model", "prompt": prompt, **fields}


def chat(content: str, **fields: Any) -> dict[str, Any]:
    return {"model": "sim-model", "messages": [{"role": "user", "content": content}], **fields}


def sse_events(body: bytes) -> list[Any]:
    """The JSON events of an SSE body, then the string "[DONE]" if it ended properly."""
    events: list[Any] = []
    for line in body.split(b"\n"):
        if line.startswith(b"data: "):
            data = line[len(b"data: ") :]
            events.append("[DONE]" if data == b"[DONE]" else orjson.loads(data))
    return events
