"""The load driver: client threads that take the scenario's requests in order, read
each answer piece by piece and record everything about it (status, bytes, who served,
first byte, end, a cut, a hang-up on purpose)."""

from __future__ import annotations

import http.client
import threading
import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Self
from urllib.parse import urlsplit

from tests.scenarios.model import Outcome, RequestSpec

# a client gives up after this long without a byte: a safety net far above every budget
# of docs/timeouts.md that a scenario sets (a request that hits it breaks I4)
CLIENT_TIMEOUT_S = 60.0
# a client whose connection is refused (Envoy restarting) waits this long before its
# next request, as a client backs off: the workload is not spent on a closed port
REFUSED_BACKOFF_S = 0.5


def send(
    url: str, spec: RequestSpec, began: Callable[[Outcome], None] = lambda _o: None
) -> Outcome:
    """One request to Envoy's listener, read to its end; a client that is to hang up
    closes the connection after the first body bytes of a stream, or right after
    sending a non-streaming request. ``began`` is told once its response headers are
    in."""
    parts = urlsplit(url)
    out = Outcome(spec, started=time.monotonic())
    last: float | None = None  # when the last body byte came, after ``started``
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=CLIENT_TIMEOUT_S)
    try:
        headers = {"content-type": "application/json", **dict(spec.headers)}
        conn.request("POST", spec.path, spec.body, headers)
        if spec.hangup and not spec.stream:  # walks away before any answer
            out.hung_up = True
            return out
        resp = conn.getresponse()
        out.status, out.served = resp.status, resp.getheader("x-sim-instance", "")
        out.dropped = resp.getheader("x-llm-d-request-dropped-reason", "")
        began(out)
        while chunk := resp.read1(65536):
            last = _after_last(out, last)
            if out.first_byte_s is None:
                out.first_byte_s = last
            out.body += chunk
            if spec.hangup:
                out.hung_up = True
                break
    except (OSError, http.client.HTTPException) as exc:
        out.error = f"{type(exc).__name__}: {exc}"
    finally:
        conn.close()
        out.seconds = _after_last(out, last)
    return out


def _after_last(out: Outcome, last: float | None) -> float:
    """Seconds since ``out`` started, now that a body byte came or it ended; the silence
    since the ``last`` byte (None: none yet) counts towards ``out.longest_gap_s``."""
    now = time.monotonic() - out.started
    if last is not None:
        out.longest_gap_s = max(out.longest_gap_s, now - last)
    return now


class Driver:
    """``with Driver(url, specs, clients) as d:`` sends every spec once, ``clients`` at a
    time; ``d.outcomes`` grows as answers come in; leaving the block waits for all.
    ``burst`` (size, at): the client that takes spec ``at`` sends it and the next
    ``size - 1`` at once, a thread each, beside the other clients."""

    def __init__(
        self, url: str, specs: Sequence[RequestSpec], clients: int, burst: tuple[int, int] = (0, 0)
    ) -> None:
        self.url = url
        self.outcomes: list[Outcome] = []
        self._open: list[Outcome] = []  # response headers in, not ended yet
        self._specs = list(specs)
        self._burst = burst
        self._next = 0
        self._lock = threading.Lock()
        self.done = threading.Event()
        self._threads = [threading.Thread(target=self._client) for _ in range(clients)]

    def answered(self) -> int:
        return len(self.outcomes)

    def _take(self) -> list[RequestSpec]:
        """The next request to send, or the burst that starts there; none at the end."""
        size, at = self._burst
        with self._lock:
            n = size if size and self._next == at else 1
            taken = self._specs[self._next : self._next + n]
            self._next += len(taken)
            return taken

    def streams_under_way(self, server: str) -> int:
        """Streams that ``server`` answered, that have their first body byte and have
        not ended."""
        with self._lock:
            return sum(
                o.spec.stream and o.served == server and o.first_byte_s is not None
                for o in self._open
            )

    def _began(self, outcome: Outcome) -> None:
        with self._lock:
            self._open.append(outcome)

    def _client(self) -> None:
        while taken := self._take():
            if len(taken) == 1:
                self._send(taken[0])
                continue
            burst = [threading.Thread(target=self._send, args=(spec,)) for spec in taken]
            for t in burst:
                t.start()
            for t in burst:
                t.join()

    def _send(self, spec: RequestSpec) -> None:
        outcome = send(self.url, spec, self._began)
        with self._lock:
            self._open = [o for o in self._open if o is not outcome]
            self.outcomes.append(outcome)
            if len(self.outcomes) == len(self._specs):
                self.done.set()
        if outcome.error.startswith("ConnectionRefusedError"):
            time.sleep(REFUSED_BACKOFF_S)

    def __enter__(self) -> Self:
        for t in self._threads:
            t.start()
        return self

    def join(self) -> None:
        for t in self._threads:
            t.join()
        self.done.set()

    def __exit__(
        self, _t: type[BaseException] | None, _e: BaseException | None, _tb: TracebackType | None
    ) -> None:
        if _e is not None:
            with self._lock:
                self._next = len(self._specs)  # on an error: no new requests
        self.join()
