"""bench.overhead's yardstick, the minimal Python picker (bench/minimal_picker.py), as a
real Envoy sees it with the EPP's own config (``full`` processing, the model servers
over EDS): it routes round robin by the Endpoint Picker Protocol, hands a large body on
intact and passes a streamed response through, so the benchmark compares the EPP with a
picker that works."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest

from bench.overhead import spawn_picker
from epp_harness.envoyconfig import EnvoyOptions, epp_config
from epp_harness.envoyproc import EnvoyProcess, write_config
from tests.support.http import request
from tests.support.sim import SimProc, completion, sims, sse_events

pytestmark = pytest.mark.e2e


@dataclass
class Routed:
    envoy: EnvoyProcess
    servers: list[SimProc]

    def post(self, doc: dict[str, object]) -> tuple[str, bytes]:
        """(the server that answered, the body) of one request through Envoy."""
        url = f"http://127.0.0.1:{self.envoy.port}/v1/completions"
        status, headers, body = request(url, orjson.dumps(doc))
        assert status == 200, body[:300]
        return headers["x-sim-instance"], body


@pytest.fixture(scope="module")
def routed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Routed]:
    workdir: Path = tmp_path_factory.mktemp("picker")
    with sims(workdir, ["--time-scale", "0"], ["--time-scale", "0"]) as servers:
        picker = spawn_picker(workdir, [s.url.removeprefix("http://") for s in servers])
        try:
            picker.wait_ready()
            opts = EnvoyOptions(listen_port=0, admin_port=0, epp_port=picker.info["grpc_port"])
            envoy = EnvoyProcess(write_config(epp_config(opts), workdir / "envoy.yaml"), workdir)
            envoy.start()
            try:
                yield Routed(envoy, servers)
            finally:
                envoy.stop()
            assert "Traceback" not in picker.log_tail(1000), picker.log_tail(1000)
        finally:
            picker.stop()


def test_requests_go_to_the_servers_in_turn(routed: Routed) -> None:
    answered = [routed.post(completion("hello", max_tokens=1))[0] for _ in range(4)]
    assert answered[0] != answered[1]
    assert answered == answered[:2] * 2


def test_a_body_larger_than_one_echoed_chunk_arrives_whole(routed: Routed) -> None:
    doc = completion("x" * 225_280, max_tokens=1)
    where, body = routed.post(doc)
    server = next(s for s in routed.servers if s.stats()["instance"] == where)
    _, direct = server.post("/v1/completions", doc)
    usage = orjson.loads(body)["usage"]
    assert usage["prompt_tokens"] == orjson.loads(direct)["usage"]["prompt_tokens"] > 50_000


def test_a_streamed_response_passes_through_chunk_for_chunk(routed: Routed) -> None:
    doc = completion("hello", max_tokens=63, stream=True, stream_options={"include_usage": True})
    _, body = routed.post(doc)
    events = sse_events(body)
    assert events[-1] == "[DONE]"
    assert events[-2]["usage"]["completion_tokens"] == 63
    assert len(events) == 63 + 2  # a token each, the usage, [DONE]
