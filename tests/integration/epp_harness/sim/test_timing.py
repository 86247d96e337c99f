"""``epp sim`` as a real process with real latencies: FIFO queueing, prefix-cache speed-up,
client disconnects and clean shutdown."""

from __future__ import annotations

import asyncio
import json
import signal
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from epp_harness.procs import ManagedProcess, start_epp

MODEL = "sim-model"
POLL_LIMIT_S = 5.0


def start_sim(workdir: Path, name: str, *args: str) -> ManagedProcess:
    return start_epp(workdir, name, "sim", "--port", "0", *args)


@pytest.fixture(scope="module")
def serial_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagedProcess]:
    """One running sequence at a time, real (unscaled) default latencies."""
    proc = start_sim(tmp_path_factory.mktemp("sim-timing"), "serial", "--max-num-seqs", "1")
    yield proc
    assert proc.stop() == 0
    assert "Traceback" not in proc.log_tail(500)


async def get_json(session: aiohttp.ClientSession, url: str) -> Any:
    async with session.get(url) as resp:
        assert resp.status == 200
        return await resp.json()


async def metric(session: aiohttp.ClientSession, base: str, name: str) -> float:
    async with session.get(f"{base}/metrics") as resp:
        text = await resp.text()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return float(sample.value)
    raise AssertionError(f"{name} not exported")


async def until(probe: Callable[[], Awaitable[Any]], ok: Callable[[Any], bool]) -> Any:
    """Poll ``probe`` until ``ok`` holds for its result; fail after POLL_LIMIT_S."""
    last: Any = None
    try:
        async with asyncio.timeout(POLL_LIMIT_S):
            while True:
                last = await probe()
                if ok(last):
                    return last
                # Remote state: there is nothing to await but another look.
                await asyncio.sleep(0.005)
    except TimeoutError:
        raise AssertionError(f"condition not reached; last value {last!r}") from None


async def complete(session: aiohttp.ClientSession, base: str, prompt: str, n: int) -> float:
    """Send a non-streaming completion; the monotonic time it finished."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": n}
    async with session.post(f"{base}/v1/completions", json=body) as resp:
        assert resp.status == 200
        await resp.read()
    return time.monotonic()


async def test_excess_requests_wait_fifo(serial_sim: ManagedProcess) -> None:
    base = serial_sim.info["url"]
    async with aiohttp.ClientSession() as session:

        async def stats() -> Any:
            return await get_json(session, f"{base}/sim/stats")

        # 40 tokens at ~8.5 ms each: ~0.35 s of running, long enough to observe the queue.
        long = asyncio.create_task(complete(session, base, "long", 40))
        await until(stats, lambda s: s["running"] == 1)
        short = asyncio.create_task(complete(session, base, "short", 1))
        seen = await until(stats, lambda s: s["waiting"] == 1)
        assert seen["running"] == 1
        assert await metric(session, base, "vllm:num_requests_waiting") == 1
        assert await metric(session, base, "vllm:num_requests_running") == 1
        assert 0 < await metric(session, base, "vllm:kv_cache_usage_perc") <= 1
        long_done, short_done = await asyncio.gather(long, short)
        assert short_done >= long_done  # it really waited for the slot
        final = await stats()
        assert (final["running"], final["waiting"], final["kv_blocks_used"]) == (0, 0, 0)


async def first_token_seconds(session: aiohttp.ClientSession, base: str, prompt: str) -> float:
    """Client-side time to the first streamed chunk."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 2, "stream": True}
    start = time.monotonic()
    async with session.post(f"{base}/v1/completions", json=body) as resp:
        assert resp.status == 200
        line = await resp.content.readline()
        ttft = time.monotonic() - start
        assert line.startswith(b"data: {")
        await resp.read()
    return ttft


async def test_repeated_long_prompt_hits_the_cache_and_starts_sooner(
    serial_sim: ManagedProcess,
) -> None:
    base = serial_sim.info["url"]
    # 20,000 chars = 5,000 tokens: ~255 ms of prefill uncached, ~5 ms when cached.
    prompt = uuid.uuid4().hex + "c" * (20_000 - 32)
    async with aiohttp.ClientSession() as session:
        hits_before = await metric(session, base, "vllm:prefix_cache_hits_total")
        ttft_count = await metric(session, base, "vllm:time_to_first_token_seconds_count")
        cold = await first_token_seconds(session, base, prompt)
        # the best of three: a busy machine may delay any one by tens of milliseconds
        warm = min([await first_token_seconds(session, base, prompt) for _ in range(3)])
        hits = await metric(session, base, "vllm:prefix_cache_hits_total") - hits_before
        count = await metric(session, base, "vllm:time_to_first_token_seconds_count")
    assert hits == 3 * 312 * 16  # every full block of the prompt, on each later request
    assert count - ttft_count == 4
    assert cold >= 0.25
    # ~5 ms against >= 255: half of that is a wide margin for the machine's delays
    assert warm < cold / 2, (cold, warm)


async def open_stream(base: str, max_tokens: int) -> tuple[asyncio.StreamReader, Any]:
    """A raw streaming request (so the test controls the socket); reads the first event."""
    url = urlsplit(base)
    reader, writer = await asyncio.open_connection(url.hostname, url.port)
    body = json.dumps(
        {"model": MODEL, "prompt": "bye", "max_tokens": max_tokens, "stream": True}
    ).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {url.netloc}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    writer.write(head.encode() + body)
    await writer.drain()
    status = await reader.readline()
    assert status.startswith(b"HTTP/1.1 200"), status
    await reader.readuntil(b"data: ")
    return reader, writer


async def test_disconnect_mid_stream_frees_the_running_slot(serial_sim: ManagedProcess) -> None:
    base = serial_sim.info["url"]
    async with aiohttp.ClientSession() as session:

        async def stats() -> Any:
            return await get_json(session, f"{base}/sim/stats")

        # 2,000 tokens would stream for ~17 s; the client leaves after the first one.
        generated = (await stats())["generation_tokens_total"]
        _, writer = await open_stream(base, 2000)
        assert (await stats())["running"] == 1
        writer.close()
        await writer.wait_closed()
        await until(stats, lambda s: s["running"] == 0 and s["kv_blocks_used"] == 0)
        # The only slot is usable again at once: the next request is served while the
        # abandoned one is far from its 2,000 tokens (it stopped with its client).
        await complete(session, base, "after", 1)
        assert (await stats())["generation_tokens_total"] - generated < 2000
    assert "Traceback" not in serial_sim.log_tail(500)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
async def test_signal_stops_cleanly_with_a_stream_in_flight(
    tmp_path: Path, sig: signal.Signals
) -> None:
    proc = start_sim(tmp_path, "stopping")
    try:
        _, writer = await open_stream(proc.info["url"], 5000)
        assert proc.proc is not None
        proc.proc.send_signal(sig)
        code = await asyncio.to_thread(proc.proc.wait, 10)
        writer.close()
    finally:
        proc.stop()
    assert code == 0
    assert "Traceback" not in proc.log_tail(500), proc.log_tail(500)
