"""What one request costs the EPP in process: the ext_proc messages of a whole exchange
fed to the real :class:`~epp.extproc.stream.ExtProcStream` and router (the default
config, the built-in observers, flow control on, ``N`` endpoints), with no transport
and no event-loop hop: the request path's own work, apart from gRPC's.

Two exchanges, each a chat completion of about 1 KB through the ``full`` processing
mode (request headers, body, response headers, response body):

* ``plain``: a non-streamed response, one body chunk carrying ``usage``;
* ``streamed``: an SSE response of ``--chunks`` chunks, the last carrying ``usage``
  (what teaches the latency model a time to first token and a decode rate).

Per round it times ``--requests`` exchanges of each kind and reports µs per request,
µs per streamed response chunk (the chunks before the last) and µs for a streamed
response's last chunk (its completion: usage read, the observers run). The median over
``--rounds`` rounds is reported.

The ``native_*`` figures carry the same two exchanges through the native transport
(epp.extproc.native) as well, with no socket: each message's HTTP/2 DATA frame is fed to
its ``Connection`` as a socket read would hand it over, the real driver and stream run
behind it on a uvloop event loop, and a stand-in transport takes the replies' writes. So
they add the transport's framing, flow control, gRPC messages, protobuf parsing and
serializing and the event loop's hops to the figures above; the socket and Envoy are
still left out.

``--against DIR`` compares another checkout of the project (e.g. a ``git worktree`` of
main): the two run in two child processes that take turns round by round, so a slow
spell of a loaded machine hits both alike, and the ratio new / old is the median of the
per-round ratios. ``--profile KIND`` prints a cProfile of one kind instead (``native-plain``,
``native-streamed``: through the native transport).
``--write`` writes ``bench/results/request-path.{md,json}`` (for a quiet machine).

    python -m bench.request_path [--endpoints 8] [--requests 300] [--rounds 11]
        [--chunks 64] [--against DIR] [--profile KIND] [--write]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import pstats
import random
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from envoy.config.core.v3.base_pb2 import HeaderMap, HeaderValue
from envoy.extensions.filters.http.ext_proc.v3.processing_mode_pb2 import ProcessingMode
from envoy.service.ext_proc.v3.external_processor_pb2 import (
    HttpBody,
    HttpHeaders,
    ProcessingRequest,
    ProtocolConfiguration,
)

REPO = Path(__file__).resolve().parents[1]
KINDS = ("plain", "streamed")
# what each round reports, µs: per request of each kind, per streamed chunk, per last
# chunk; then the same through the native transport
FIGURES = (
    "plain_us",
    "streamed_us",
    "chunk_us",
    "last_chunk_us",
    "native_plain_us",
    "native_streamed_us",
    "native_chunk_us",
)
PROCESS = "/envoy.service.ext_proc.v3.ExternalProcessor/Process"
_FULL_DUPLEX = ProcessingMode.FULL_DUPLEX_STREAMED


def _headers(pairs: dict[str, str], end: bool = False) -> HttpHeaders:
    values = [HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs.items()]
    return HttpHeaders(headers=HeaderMap(headers=values), end_of_stream=end)


def request_body(stream: bool) -> bytes:
    """A chat completion of about 1 KB."""
    doc: dict[str, Any] = {
        "model": "m",
        "messages": [
            {"role": "system", "content": "You are a careful assistant. " * 12},
            {"role": "user", "content": "Summarize the quarterly report in three lines. " * 12},
        ],
        "max_tokens": 64,
    }
    if stream:
        doc["stream"] = True
        doc["stream_options"] = {"include_usage": True}
    return orjson.dumps(doc)


def response_chunks(stream: bool, chunks: int) -> list[bytes]:
    """The response body as the server sends it: one JSON document, or ``chunks`` SSE
    events (one token each; the last carries ``usage`` and ``[DONE]``)."""
    usage = {"prompt_tokens": 260, "completion_tokens": chunks, "total_tokens": 260 + chunks}
    if not stream:
        doc = {
            "id": "cmpl-1",
            "object": "chat.completion",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok " * 64}}],
            "usage": usage,
        }
        return [orjson.dumps(doc)]
    out = []
    for i in range(chunks - 1):
        delta = {"choices": [{"index": 0, "delta": {"content": f" t{i}"}}], "id": "cmpl-1"}
        out.append(b"data: " + orjson.dumps(delta) + b"\n\n")
    last = {"choices": [], "id": "cmpl-1", "usage": usage}
    out.append(b"data: " + orjson.dumps(last) + b"\n\ndata: [DONE]\n\n")
    return out


@dataclass(frozen=True)
class Exchange:
    """One exchange's messages: up to the response body, then the body's chunks."""

    head: list[ProcessingRequest]
    chunks: list[ProcessingRequest]


def exchange(stream: bool, chunks: int) -> Exchange:
    first = ProcessingRequest(
        request_headers=_headers(
            {
                ":method": "POST",
                ":path": "/v1/chat/completions",
                ":authority": "gateway",
                ":scheme": "http",
                "content-type": "application/json",
                "user-agent": "bench",
                "x-request-id": "2d2b3c1a-55b7-4f1e-9c35-0f6f2f0b8a11",
                "x-forwarded-proto": "http",
            }
        ),
        protocol_config=ProtocolConfiguration(
            request_body_mode=_FULL_DUPLEX, response_body_mode=_FULL_DUPLEX
        ),
    )
    body = ProcessingRequest(request_body=HttpBody(body=request_body(stream), end_of_stream=True))
    content = "text/event-stream" if stream else "application/json"
    response = ProcessingRequest(
        response_headers=_headers({":status": "200", "content-type": content})
    )
    pieces = response_chunks(stream, chunks)
    messages = [
        ProcessingRequest(response_body=HttpBody(body=piece, end_of_stream=i == len(pieces) - 1))
        for i, piece in enumerate(pieces)
    ]
    return Exchange([first, body, response], messages)


def router(endpoints: int) -> Any:
    """The request path as ``epp serve`` composes it with the default config."""
    from epp.config import build_scheduler
    from epp.datastore import Datastore
    from epp.observability.metrics import EppMetrics
    from epp.types import Endpoint
    from tests.support.routers import make_router

    ds = Datastore()
    for i in range(endpoints):
        ds.add(Endpoint(f"10.0.{i // 250}.{i % 250 + 1}", 8000))
    return make_router(ds, build_scheduler(""), EppMetrics(ds), rng=random.Random(0))


class _Socket:
    """What the native transport's connection writes to, in place of a socket: it counts
    the writes and their bytes (a reply is one write per event-loop turn)."""

    def __init__(self) -> None:
        self.writes = 0
        self.sent = 0

    def write(self, data: bytes) -> None:
        self.writes += 1
        self.sent += len(data)

    def get_write_buffer_size(self) -> int:
        return 0

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass


class NativeBench:
    """The exchanges carried by the native transport with no socket (see the module's
    docstring): one connection, a new stream per exchange, as Envoy sends them."""

    def __init__(self, router_: Any, exchanges: dict[str, Exchange]) -> None:
        import uvloop
        from hpack import Encoder

        from epp.extproc.native import frames

        self._frames = frames
        self.loop = uvloop.new_event_loop()
        self.router = router_
        self._encoder = Encoder()
        self._socket = _Socket()
        self._credited = 0  # of what the server sent, given back as window
        self._stream_id = -1
        self._exchanges = {kind: self._data(ex) for kind, ex in exchanges.items()}
        self.conn: Any = None
        self.loop.run_until_complete(self._connect())

    def _data(self, ex: Exchange) -> tuple[list[bytes], list[bytes]]:
        """Each message as a gRPC message in a DATA frame (its stream id patched in
        later); the last one ends the stream, as Envoy half-closes after it."""

        def frame(msg: ProcessingRequest, end: bool) -> bytes:
            body = msg.SerializeToString()
            payload = b"\0" + len(body).to_bytes(4, "big") + body
            return self._frames.header(len(payload), 0, 1 if end else 0, 0) + payload

        *chunks, last = ex.chunks
        return [frame(m, False) for m in ex.head], [
            *(frame(m, False) for m in chunks),
            frame(last, True),
        ]

    async def _connect(self) -> None:
        from envoy.service.ext_proc.v3.external_processor_pb2 import ProcessingRequest

        from epp.extproc.driver import drive
        from epp.extproc.native.connection import Connection
        from epp.extproc.native.grpc import GrpcServer, Method

        router_ = self.router

        async def process(call: Any) -> None:
            await drive(call, router_)

        server = GrpcServer({PROCESS: Method(ProcessingRequest.FromString, process)}, 64 << 20)
        self.conn = Connection(server.open_stream, lambda _: None)
        self.conn.connection_made(self._socket)
        window = self._frames.MAX_WINDOW
        settings = (4).to_bytes(2, "big") + window.to_bytes(4, "big")  # INITIAL_WINDOW_SIZE
        self.conn.data_received(
            self._frames.PREFACE + self._frames.header(len(settings), 4, 0, 0) + settings
        )
        await self._settle()

    async def _settle(self) -> None:
        """Let the handler and the connection run what the last frames started."""
        for _ in range(8):
            await asyncio.sleep(0)

    async def _answered(self, frame: bytes) -> None:
        """Feed one message's frame and let the loop run until its reply is written (the
        handler's turn, then the connection's flush)."""
        sock = self._socket
        writes = sock.writes
        self.conn.data_received(frame)
        while sock.writes == writes:  # noqa: ASYNC110 - the loop's own turns are measured
            await asyncio.sleep(0)

    def _with_id(self, frame: bytes) -> bytes:
        return frame[:5] + self._stream_id.to_bytes(4, "big") + frame[9:]

    async def _one(self, kind: str) -> tuple[float, float]:
        """One exchange: (seconds for the chunks but the last, for the last)."""
        head, chunks = self._exchanges[kind]
        self._stream_id += 2
        headers = self._encoder.encode(
            [
                (":method", "POST"),
                (":scheme", "http"),
                (":path", PROCESS),
                (":authority", "epp"),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
            ]
        )
        frames = self._frames
        opening = frames.header(len(headers), 1, 4, self._stream_id) + headers
        self.conn.data_received(opening + b"".join(self._with_id(f) for f in head))
        await self._settle()
        sock = self._socket
        clock = time.perf_counter
        *middle, last = [self._with_id(f) for f in chunks]
        start = clock()
        for frame in middle:
            await self._answered(frame)
        between = clock()
        await self._answered(last)
        end = clock()
        await self._settle()  # the trailers
        owed = sock.sent - self._credited  # keep the server's send window open
        if owed:
            self.conn.data_received(frames.header(4, 8, 0, 0) + owed.to_bytes(4, "big"))
            self._credited = sock.sent
        return between - start, end - between

    def round(self, requests: int) -> dict[str, float]:
        return self.loop.run_until_complete(self._round(requests))

    async def _round(self, requests: int) -> dict[str, float]:
        clock = time.perf_counter
        out: dict[str, float] = {}
        for kind in KINDS:
            middle = 0.0
            start = clock()
            for _ in range(requests):
                m, _last = await self._one(kind)
                middle += m
            out[f"native_{kind}_us"] = (clock() - start) / requests * 1e6
            if kind == "streamed":
                chunks = len(self._exchanges[kind][1]) - 1
                out["native_chunk_us"] = middle / (requests * max(chunks, 1)) * 1e6
        return out


class Bench:
    """Rounds of exchanges against one router."""

    def __init__(self, endpoints: int, chunks: int) -> None:
        from epp.extproc.stream import ExtProcStream

        self.stream_class = ExtProcStream
        self.router = router(endpoints)
        self.exchanges = {"plain": exchange(False, chunks), "streamed": exchange(True, chunks)}
        self.native = NativeBench(self.router, self.exchanges)

    def one(self, kind: str) -> tuple[float, float]:
        """One exchange; (seconds in the chunks before the last, seconds in the last)."""
        ex = self.exchanges[kind]
        stream = self.stream_class(self.router)
        for msg in ex.head:
            stream.on_message(msg)
        *middle, last = ex.chunks
        clock = time.perf_counter
        start = clock()
        for msg in middle:
            stream.on_message(msg)
        between = clock()
        stream.on_message(last)
        end = clock()
        stream.close()
        return between - start, end - between

    def round(self, requests: int) -> dict[str, float]:
        clock = time.perf_counter
        out: dict[str, float] = {}
        for kind in KINDS:
            middle = last = 0.0
            start = clock()
            for _ in range(requests):
                m, la = self.one(kind)
                middle += m
                last += la
            out[f"{kind}_us"] = (clock() - start) / requests * 1e6
            if kind == "streamed":
                chunks = len(self.exchanges[kind].chunks) - 1
                out["chunk_us"] = middle / (requests * max(chunks, 1)) * 1e6
                out["last_chunk_us"] = last / requests * 1e6
        out.update(self.native.round(requests))
        return out


def serve(args: argparse.Namespace) -> int:
    """A child of ``--against``: one round per line read, its figures as a JSON line."""
    bench = Bench(args.endpoints, args.chunks)
    bench.round(max(args.requests // 4, 10))  # warm up
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() != "round":
            break
        print(json.dumps(bench.round(args.requests)), flush=True)
    return 0


class Child:
    """This benchmark in a child process running the code of checkout ``root``."""

    def __init__(self, root: Path, args: argparse.Namespace) -> None:
        code = (
            "import runpy, sys; sys.path.insert(0, sys.argv[1]); "
            "sys.argv = [sys.argv[2], *sys.argv[3:]]; "
            "runpy.run_path(sys.argv[0], run_name='__main__')"
        )
        argv = [
            "--serve",
            "--endpoints",
            str(args.endpoints),
            "--requests",
            str(args.requests),
            "--chunks",
            str(args.chunks),
        ]
        env = {**os.environ, "PYTHONPATH": str(root)}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code, str(root), __file__, *argv],
            cwd=root,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None and self.proc.stdin is not None
        self.stdin, self.stdout = self.proc.stdin, self.proc.stdout
        if self.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the benchmark did not start in {root}")

    def round(self) -> dict[str, float]:
        self.stdin.write("round\n")
        self.stdin.flush()
        line = self.stdout.readline()
        if not line:
            raise RuntimeError("the benchmark's child process ended")
        result: dict[str, float] = json.loads(line)
        return result

    def close(self) -> None:
        self.stdin.close()
        self.proc.wait(timeout=30)


def compare(args: argparse.Namespace) -> dict[str, Any]:
    """Old (``--against``) and new take turns, round by round."""
    old, new = Child(Path(args.against).resolve(), args), Child(REPO, args)
    rounds: list[dict[str, dict[str, float]]] = []
    try:
        for i in range(args.rounds):
            pair = (("old", old), ("new", new)) if i % 2 == 0 else (("new", new), ("old", old))
            rounds.append({name: child.round() for name, child in pair})
            print(f"  round {i + 1}/{args.rounds}", file=sys.stderr, flush=True)
    finally:
        old.close()
        new.close()
    rows = {}
    for figure in FIGURES:
        olds = [r["old"][figure] for r in rounds]
        news = [r["new"][figure] for r in rounds]
        rows[figure] = {
            "old": statistics.median(olds),
            "new": statistics.median(news),
            "ratio": statistics.median(n / o for n, o in zip(news, olds, strict=True)),
        }
    return {"against": str(args.against), "rows": rows, "rounds": rounds}


def alone(args: argparse.Namespace) -> dict[str, Any]:
    bench = Bench(args.endpoints, args.chunks)
    bench.round(max(args.requests // 4, 10))
    rounds = [bench.round(args.requests) for _ in range(args.rounds)]
    rows = {f: {"new": statistics.median(r[f] for r in rounds)} for f in FIGURES}
    return {"rows": rows, "rounds": rounds}


LABELS = {
    "plain_us": "non-streamed request, µs",
    "streamed_us": "streamed request, µs",
    "chunk_us": "streamed response chunk (not the last), µs",
    "last_chunk_us": "streamed response's last chunk (completion), µs",
    "native_plain_us": "non-streamed request through the native transport, µs",
    "native_streamed_us": "streamed request through the native transport, µs",
    "native_chunk_us": "streamed response chunk through the native transport, µs",
}


def report(doc: dict[str, Any]) -> str:
    rows = doc["rows"]
    lines = []
    if "against" in doc:
        lines += ["| | old | new | new / old |", "|---|---:|---:|---:|"]
        for figure, row in rows.items():
            lines.append(
                f"| {LABELS[figure]} | {row['old']:.1f} | {row['new']:.1f} | {row['ratio']:.2f} |"
            )
    else:
        lines += ["| | µs |", "|---|---:|"]
        for figure, row in rows.items():
            lines.append(f"| {LABELS[figure]} | {row['new']:.1f} |")
    return "\n".join(lines) + "\n"


PROFILES = (*KINDS, *(f"native-{kind}" for kind in KINDS))


def profile_stats(kind: str, endpoints: int, chunks: int, requests: int) -> pstats.Stats:
    """A cProfile of ``requests`` exchanges of ``kind`` (:data:`PROFILES`: ``native-``
    carries them through the native transport)."""
    bench = Bench(endpoints, chunks)
    bench.round(20)
    native, _, plain_kind = kind.rpartition("-")
    profiler = cProfile.Profile()
    if native:

        async def run() -> None:
            for _ in range(requests):
                await bench.native._one(plain_kind)

        profiler.enable()
        bench.native.loop.run_until_complete(run())
    else:
        profiler.enable()
        for _ in range(requests):
            bench.one(kind)
    profiler.disable()
    return pstats.Stats(profiler)


def profile(args: argparse.Namespace) -> None:
    stats = profile_stats(args.profile, args.endpoints, args.chunks, args.requests)
    stats.sort_stats("tottime").print_stats(30)


def write(doc: dict[str, Any], table: str, args: argparse.Namespace) -> None:
    from bench.host import git_state, machine_description
    from bench.result_files import run_header, write_pair

    meta = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": machine_description(),
        "git": git_state(),
        "elapsed_s": doc["elapsed_s"],
        "command": "python -m bench.request_path " + " ".join(sys.argv[1:]),
    }
    doc = {"meta": meta, **doc}
    text = "\n".join(run_header("Request path in process", meta)) + "\n" + table
    write_pair(REPO / "bench" / "results", "request-path", doc, text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--endpoints", type=int, default=8)
    parser.add_argument("--requests", type=int, default=300, help="exchanges of each kind a round")
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--chunks", type=int, default=64, help="a streamed response's chunks")
    parser.add_argument("--against", metavar="DIR", help="another checkout to compare with")
    parser.add_argument("--profile", choices=PROFILES, help="print a cProfile of one kind")
    parser.add_argument("--write", action="store_true", help="write bench/results/request-path.*")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        return serve(args)
    if args.profile:
        profile(args)
        return 0
    started = time.monotonic()
    doc = compare(args) if args.against else alone(args)
    doc["elapsed_s"] = time.monotonic() - started
    doc["config"] = {k: getattr(args, k) for k in ("endpoints", "requests", "rounds", "chunks")}
    table = report(doc)
    print(table, end="")
    if args.write:
        write(doc, table, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
