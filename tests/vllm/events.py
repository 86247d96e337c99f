"""Our own view of a vLLM server's KV events, independent of the EPP's code: a SUB
socket that keeps every raw message and counts the blocks the server says it holds."""

from __future__ import annotations

import threading
from typing import Any

import msgspec
import zmq


class EventLog:
    """Subscribes to ``tcp://127.0.0.1:PORT`` in a thread; ``frames`` holds every message
    as received (topic, sequence bytes, payload)."""

    def __init__(self, port: int) -> None:
        self.frames: list[list[bytes]] = []
        self._context = zmq.Context.instance()
        self._socket = self._context.socket(zmq.SUB)
        self._socket.setsockopt(zmq.SUBSCRIBE, b"")
        self._socket.setsockopt(zmq.RCVTIMEO, 100)
        self._socket.connect(f"tcp://127.0.0.1:{port}")
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                frames = self._socket.recv_multipart()
            except zmq.Again:
                continue
            with self._lock:
                self.frames.append(frames)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._socket.close(linger=0)

    def events(self) -> list[dict[str, Any]]:
        with self._lock:
            frames = list(self.frames)
        out: list[dict[str, Any]] = []
        for _topic, _seq, payload in frames:
            _ts, events, *_ = msgspec.msgpack.decode(payload)
            out.extend(events)
        return out

    def blocks(self) -> int:
        """Blocks held after the events so far (from the first AllBlocksCleared on: a
        known empty cache; before it this subscriber may have missed messages)."""
        held: set[int] | None = None
        for event in self.events():
            kind = event["type"]
            if kind == "AllBlocksCleared":
                held = set()
            elif held is not None and kind == "BlockStored":
                held.update(event["block_hashes"])
            elif held is not None and kind == "BlockRemoved":
                held.difference_update(event["block_hashes"])
        assert held is not None, "no AllBlocksCleared seen"
        return len(held)

    def kinds(self) -> set[str]:
        return {e["type"] for e in self.events()}
