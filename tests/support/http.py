"""Small HTTP helpers over the standard library for tests (no extra client deps)."""

from __future__ import annotations

import http.client
import json
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit


def request(
    url: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    method: str | None = None,
    timeout: float = 30.0,
) -> tuple[int, dict[str, str], bytes]:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    try:
        conn.request(
            method or ("POST" if body is not None else "GET"),
            (parts.path or "/") + (f"?{parts.query}" if parts.query else ""),
            body=body,
            headers={"content-type": "application/json", **(headers or {})},
        )
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def get_json(url: str) -> Any:
    status, _, body = request(url)
    assert status == 200, f"GET {url} -> {status}: {body[:200]!r}"
    return json.loads(body)


def metric_sum(metrics_text: str, name: str) -> float:
    """Sum of all samples of ``name`` (any labels) in Prometheus text."""
    total = 0.0
    for line in metrics_text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def metric_samples(metrics_url: str, prefix: str = "epp_") -> dict[str, float]:
    """Every sample whose name starts with ``prefix`` at ``metrics_url``, keyed by its
    name with labels as Prometheus text writes them."""
    _, _, body = request(metrics_url)
    samples = {}
    for line in body.decode().splitlines():
        if line.startswith(prefix):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


def epp_in_flight(epp_http_url: str) -> float:
    _, _, body = request(f"{epp_http_url}/metrics")
    return metric_sum(body.decode(), "epp_in_flight_requests")


def open_raw_post(url: str, path: str, body: bytes, close: bool = False) -> socket.socket:
    """Send a POST on a raw socket and return it unread, so a test can read a streaming
    response piece by piece or walk away from it mid-stream."""
    parts = urlsplit(url)
    sock = socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 80), timeout=10)
    sock.sendall(
        f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n".encode()
        + (b"connection: close\r\n" if close else b"")
        + f"content-length: {len(body)}\r\n\r\n".encode()
        + body
    )
    return sock


@contextmanager
def held(url: str, path: str, bodies: list[bytes]) -> Iterator[None]:
    """POST ``bodies`` to ``url`` (e.g. straight to a simulator, where the EPP does not
    see them), each on a socket of its own, and hang up on exit: the simulator cancels a
    request whose client went away, so a test keeps a server busy exactly as long as
    it needs without waiting for the requests to run to their end."""
    socks = []
    try:
        for body in bodies:
            socks.append(open_raw_post(url, path, body))
        yield
    finally:
        for sock in socks:
            sock.close()
