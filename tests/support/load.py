"""Client load for fault tests: threads that send requests until stopped and record
every outcome (a reset or dropped connection, or a body cut short, counts as an error,
status 0)."""

from __future__ import annotations

import http.client
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Self

from tests.support.http import request


@dataclass(frozen=True)
class Outcome:
    status: int  # 0: the connection failed or the body was cut; negative: a 200 whose
    # body was whole but incomplete (the ``complete`` check failed)
    served: str  # x-sim-instance, or the error
    seconds: float
    started: float  # time.monotonic() when it was sent


class Load:
    """``with Load(url, bodies) as load:`` one thread per body posts it to ``url`` over
    and over; ``load.results`` grows as answers come in."""

    def __init__(
        self,
        url: str,
        bodies: Sequence[bytes],
        *,
        timeout: float = 30.0,
        complete: Callable[[bytes, bytes], bool] = lambda _body, _raw: True,
    ) -> None:
        self.url = url
        self.results: list[Outcome] = []
        self._stop = threading.Event()
        self._timeout = timeout
        self._complete = complete
        self._workers = [threading.Thread(target=self._run, args=(b,)) for b in bodies]

    def _run(self, body: bytes) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                status, headers, raw = request(self.url, body, timeout=self._timeout)
            except (OSError, http.client.HTTPException) as exc:
                self.results.append(
                    Outcome(0, f"{type(exc).__name__}: {exc}", time.monotonic() - started, started)
                )
                continue
            if status == 200 and not self._complete(body, raw):
                status = -status
            served = headers.get("x-sim-instance", "")
            self.results.append(Outcome(status, served, time.monotonic() - started, started))

    def served_by(self, address: str, since: int = 0) -> bool:
        return any(r.served == address for r in self.results[since:])

    def errors(self) -> list[Outcome]:
        return [r for r in self.results if r.status != 200]

    def __enter__(self) -> Self:
        for w in self._workers:
            w.start()
        return self

    def __exit__(
        self, _t: type[BaseException] | None, _e: BaseException | None, _tb: TracebackType | None
    ) -> None:
        self._stop.set()
        for w in self._workers:
            w.join()
