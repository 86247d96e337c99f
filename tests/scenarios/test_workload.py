"""The workloads a seed draws: conversations whose turns extend each other, a burst
sent at once (the driver against a real HTTP server on loopback), and short scenarios
(the fast tier, recorded replays) left as they were."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import orjson

from tests.scenarios.drive import Driver
from tests.scenarios.generate import SESSIONS, requests, scenario
from tests.scenarios.model import CHAT_PATH, COMPLETIONS_PATH, RequestSpec

SEED = 75  # draws conversations (60 %) and a burst of 16 at request 17 of 42


def _prompt(spec: RequestSpec) -> str:
    doc = orjson.loads(spec.body)
    return "".join(m["content"] for m in doc["messages"]) if "messages" in doc else doc["prompt"]


def test_a_conversation_s_turns_extend_each_other_as_chat_requests() -> None:
    s = scenario(SEED, "plain", "none")
    assert s.workload.session_share == 0.6
    specs = requests(s)
    for session in range(SESSIONS):
        turns = [spec for spec in specs if spec.session == session]
        assert len(turns) >= 2
        assert all(t.path == CHAT_PATH for t in turns)
        for before, after in itertools.pairwise(turns):
            assert _prompt(after).startswith(_prompt(before)[: len(_prompt(before)) - 60])
            assert len(_prompt(after)) > len(_prompt(before))
    others = [spec for spec in specs if spec.session < 0]
    assert others and all(spec.path == COMPLETIONS_PATH for spec in others)


def test_short_scenarios_draw_no_conversation_nor_burst() -> None:
    """Short scenarios (the fast tier, the recorded --short replays) draw what they drew
    before conversations and bursts were added."""
    long, short = scenario(SEED, "plain", "none"), scenario(SEED, "plain", "none", short=True)
    assert long.workload.burst == 16 and long.workload.session_share
    assert short.workload.burst == 0 and short.workload.session_share == 0
    assert short.fault == scenario(SEED, "plain", "none", short=True).fault
    assert "conversations" not in short.describe() and "burst" not in short.describe()
    # the token-id shape's I7 judges text prompts: no conversations there
    assert scenario(SEED, "kv-events", "none").workload.session_share == 0


@contextmanager
def _server(together: set[str]) -> Iterator[tuple[str, list[str]]]:
    """An HTTP server on loopback that answers the requests for the paths ``together``
    only once all of them are in at the same time (a barrier; 504 if they never are)
    and the others at once; it records the paths in the order they came."""
    barrier = threading.Barrier(len(together), timeout=30)
    paths: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["content-length"]))
            paths.append(self.path)
            status = 200
            if self.path in together:
                try:
                    barrier.wait()
                except threading.BrokenBarrierError:
                    status = 504
            body = b'{"choices": []}'
            self.send_response(status)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", paths
    finally:
        server.shutdown()
        server.server_close()


def test_the_driver_sends_a_burst_at_once_beside_its_clients() -> None:
    """One client, and a burst of 4 at request 1: requests 1 to 4 are answered only if
    all four are in at once, which one client alone never does."""
    specs = [RequestSpec(i, b"{}", "m", False, False, path=f"/r{i}") for i in range(6)]
    with (
        _server({f"/r{i}" for i in range(1, 5)}) as (url, paths),
        Driver(url, specs, 1, (4, 1)) as driver,
    ):
        pass
    assert sorted(o.spec.index for o in driver.outcomes) == list(range(6))
    assert all(o.status == 200 for o in driver.outcomes), [o.status for o in driver.outcomes]
    assert paths[0] == "/r0" and sorted(paths[1:5]) == [f"/r{i}" for i in range(1, 5)]
    assert paths[5] == "/r5"  # after the burst: its client waited for all four
