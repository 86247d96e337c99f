"""A lean closed-loop HTTP/1.1 load generator (raw asyncio streams, keep-alive).

Each of ``--concurrency`` connections sends the same POST back to back for
``--duration`` seconds after ``--warmup`` (or, with ``--think-ms``, after a random pause
drawn from an exponential distribution with that mean, which keeps clients from moving
in lockstep behind servers that all take the same time); prints one JSON line of
results. Kept minimal so the generator itself takes little of the machine's two cores.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import orjson


async def _read_response(reader: asyncio.StreamReader) -> int:
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    lower = head.lower()
    idx = lower.find(b"content-length:")
    if idx >= 0:
        end = lower.index(b"\r\n", idx)
        await reader.readexactly(int(lower[idx + 15 : end]))
    elif b"transfer-encoding: chunked" in lower:
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            await reader.readexactly(size + 2)
            if size == 0:
                break
    return status


async def _worker(
    host: str,
    port: int,
    request: bytes,
    start: float,
    stop: float,
    out: list[float],
    errors: list[int],
    think_s: float,
) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        while True:
            if think_s:
                await asyncio.sleep(random.expovariate(1 / think_s))
            t0 = time.perf_counter()
            if t0 >= stop:
                return
            writer.write(request)
            status = await _read_response(reader)
            t1 = time.perf_counter()
            if t0 >= start:
                if status == 200:
                    out.append(t1 - t0)
                else:
                    errors.append(status)
    finally:
        writer.close()


async def run_load(
    url: str, body: bytes, concurrency: int, duration: float, warmup: float, think_s: float = 0.0
) -> dict[str, object]:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    request = (
        f"POST {parts.path} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    ).encode() + body
    now = time.perf_counter()
    start, stop = now + warmup, now + warmup + duration
    latencies: list[float] = []
    errors: list[int] = []
    await asyncio.gather(
        *(
            _worker(host, port, request, start, stop, latencies, errors, think_s)
            for _ in range(concurrency)
        )
    )
    latencies.sort()

    def pct(p: float) -> float:
        return (
            latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000 if latencies else 0.0
        )

    return {
        "requests": len(latencies),
        "errors": len(errors),
        "rps": len(latencies) / duration,
        "p50_ms": pct(0.50),
        "p90_ms": pct(0.90),
        "p99_ms": pct(0.99),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", required=True)
    body = parser.add_mutually_exclusive_group(required=True)
    body.add_argument("--body", help="request body (JSON text)")
    body.add_argument("--body-file", type=Path, help="file holding the request body")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument(
        "--think-ms", type=float, default=0.0, help="mean random pause before each request"
    )
    args = parser.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    result = asyncio.run(
        run_load(
            args.url,
            args.body.encode() if args.body is not None else args.body_file.read_bytes(),
            args.concurrency,
            args.duration,
            args.warmup,
            args.think_ms / 1000,
        )
    )
    sys.stdout.write(orjson.dumps(result).decode() + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
