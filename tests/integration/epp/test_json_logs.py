"""`epp serve --log-format json`: every line of its output is one JSON object, and the
lines logged while a request is handled name it."""

from __future__ import annotations

from pathlib import Path

import grpc
import orjson
from envoy.service.ext_proc.v3.external_processor_pb2_grpc import ExternalProcessorStub

from epp_harness.procs import start_epp
from tests.support import extproc as m


def test_json_lines_with_the_request_id(tmp_path: Path, closed_addresses: list[str]) -> None:
    proc = start_epp(
        tmp_path, "epp", "serve", "--grpc-port", "0", "--http-port", "0",
        "--grpc-health-port", "0", "--endpoint", closed_addresses[0], "--log-format", "json",
    )  # fmt: skip
    try:
        with grpc.insecure_channel(f"127.0.0.1:{proc.info['grpc_port']}") as channel:
            messages = [m.request_headers({"x-request-id": "rid-42"}), *m.chunked(b"{bad", 1)]
            list(ExternalProcessorStub(channel).Process(iter(messages), timeout=10))
    finally:
        proc.stop()
    docs = [orjson.loads(line) for line in (tmp_path / "epp.log").read_text().splitlines()]
    assert all({"time", "level", "logger", "message"} <= d.keys() for d in docs)
    rejected = [d for d in docs if "rejected: 400" in d["message"]]
    assert rejected and rejected[0]["request_id"] == "rid-42"
    assert rejected[0]["level"] == "info" and rejected[0]["logger"] == "epp.extproc.stream"
    assert "request_id" not in docs[0]  # start-up lines belong to no request
