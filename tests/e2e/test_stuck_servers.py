"""Bounded waits through the real Envoy: a frozen model server (SIGSTOP) costs a retry on
another endpoint, not a hung request; a stream frozen after its first bytes is cut
within the stream idle timeout; an unreachable EPP answers 503 with a JSON body."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import orjson
import pytest

from epp_harness.envoyconfig import EnvoyOptions
from epp_harness.stack import LocalStack
from tests.e2e.conftest import ephemeral
from tests.support.http import open_raw_post, request
from tests.support.load import Load
from tests.support.wait import quiesce, wait_for

pytestmark = pytest.mark.e2e

CLUSTER = "cluster.model_servers"

# Per-attempt silence allowed (both kinds), short so the test is quick; the defaults
# are in docs/timeouts.md.
IDLE_S = 1.5
BODY = orjson.dumps({"model": "sim-model", "prompt": "frozen?", "max_tokens": 4})
STREAM = orjson.dumps({"model": "sim-model", "prompt": "frozen?", "max_tokens": 4, "stream": True})


def started() -> LocalStack:
    opts = ephemeral(
        servers=3,
        sim_args=["--time-scale", "0.05"],
        first_byte_timeout_s=IDLE_S,
        stream_idle_timeout_s=IDLE_S,
    )
    return LocalStack(opts)


@pytest.fixture(scope="module")
def stack() -> Iterator[LocalStack]:
    """Shared by the tests that leave it serving: a server they freeze is thawed again."""
    with started() as s:
        yield s


@pytest.fixture
def own_stack() -> Iterator[LocalStack]:
    """For a test that kills part of it."""
    with started() as s:
        yield s


def sim_pid(stack: LocalStack, address: str) -> int:
    for sim, sim_address in zip(stack.sims, stack.sim_addresses, strict=True):
        if sim_address == address:
            return sim.pid
    raise AssertionError(f"no simulator at {address}")


def envoy_counter(stack: LocalStack, name: str) -> int:
    assert stack.envoy is not None
    _, _, body = request(f"{stack.envoy.admin_url}/stats?format=json&filter={name}")
    return sum(int(s["value"]) for s in orjson.loads(body)["stats"] if s.get("name") == name)


def test_requests_on_a_frozen_server_are_retried_elsewhere(stack: LocalStack) -> None:
    frozen = stack.sim_addresses[0]
    pid = sim_pid(stack, frozen)
    counted = ("per_try_idle_timeout", "retry", "retry_success", "retry_limit_exceeded")
    before = {c: envoy_counter(stack, f"{CLUSTER}.upstream_rq_{c}") for c in counted}
    load = Load(
        f"{stack.envoy_url}/v1/completions",
        [BODY, STREAM] * 3,
        timeout=4 * IDLE_S + 5,
        complete=lambda body, raw: b"[DONE]" in raw if body is STREAM else b"choices" in raw,
    )
    with load:
        frozen_at = time.monotonic()
        os.kill(pid, signal.SIGSTOP)
        try:
            # requests routed to it before the EPP ejects it (scrape timeouts) wait
            # IDLE_S and go to another endpoint
            wait_for(
                lambda: envoy_counter(stack, f"{CLUSTER}.upstream_rq_per_try_idle_timeout") >= 2,
                timeout=20,
                what="per-try idle timeouts on the frozen server",
            )
            done = len(load.results)
            wait_for(lambda: len(load.results) > done + 20, timeout=20, what="load after it")
        finally:
            os.kill(pid, signal.SIGCONT)
    quiesce(stack)
    after = {c: envoy_counter(stack, f"{CLUSTER}.upstream_rq_{c}") - before[c] for c in counted}
    slowest = max(r.seconds for r in load.results)
    print(
        f"frozen server: {len(load.results)} requests, {len(load.errors())} errors, "
        f"slowest {slowest:.2f}s; Envoy: {after}"
    )
    # a stream whose first bytes had already reached the client cannot be retried: it is
    # cut (IncompleteRead) once the idle timeout fires. Only those may fail, and only
    # requests sent before the freeze.
    cut = [r for r in load.errors() if r.served.startswith("IncompleteRead")]
    assert cut == load.errors()
    assert all(r.started < frozen_at for r in cut)
    assert not any(r.served == frozen for r in load.results if r.seconds > IDLE_S)
    # one silent attempt at most, then an answer from another endpoint: every silent
    # attempt but the cut streams' was retried, each in a request of its own that then
    # succeeded (Envoy counts a retried request's success once)
    assert after["per_try_idle_timeout"] >= 2
    assert after["retry_limit_exceeded"] == 0
    assert after["retry_success"] == after["retry"] == after["per_try_idle_timeout"] - len(cut)


def test_a_stream_frozen_after_its_first_bytes_is_cut(stack: LocalStack) -> None:
    body = orjson.dumps(
        {"model": "sim-model", "prompt": "a long one", "max_tokens": 2000, "stream": True}
    )
    idle_before = envoy_counter(stack, f"{CLUSTER}.upstream_rq_per_try_idle_timeout")
    sock = open_raw_post(stack.envoy_url, "/v1/completions", body)
    with sock:
        sock.settimeout(30)
        head = b""
        while b"data:" not in head:
            chunk = sock.recv(65536)
            assert chunk, head
            head += chunk
        served = head.lower().split(b"x-sim-instance: ", 1)[1].split(b"\r\n", 1)[0].decode()
        pid = sim_pid(stack, served)
        os.kill(pid, signal.SIGSTOP)
        frozen_at = time.monotonic()
        try:
            rest = b""
            while chunk := sock.recv(65536):
                rest += chunk
            cut_after = time.monotonic() - frozen_at
        finally:
            os.kill(pid, signal.SIGCONT)
    # no retry is possible once the client has bytes: the response ends unfinished
    assert b"[DONE]" not in rest and not rest.endswith(b"0\r\n\r\n")
    # cut by Envoy's per-try idle timeout (not before it), not by the EPP's own chunk
    # watch (15 s) or the route timeout
    assert cut_after > IDLE_S - 0.1, cut_after
    assert envoy_counter(stack, f"{CLUSTER}.upstream_rq_per_try_idle_timeout") == idle_before + 1


def test_unreachable_epp_answers_503_with_a_json_error(own_stack: LocalStack) -> None:
    stack = own_stack
    assert stack.epp is not None
    assert request(f"{stack.envoy_url}/v1/completions", BODY)[0] == 200
    stack.epp.proc.send_signal(signal.SIGKILL)  # type: ignore[union-attr]
    stack.epp.proc.wait()  # type: ignore[union-attr]
    status, headers, raw = request(f"{stack.envoy_url}/v1/completions", BODY)
    assert status == EnvoyOptions.status_on_error == 503
    assert headers["content-type"] == "application/json"
    error = orjson.loads(raw)["error"]
    assert "endpoint picker" in error["message"]
    assert error["type"] == "service_unavailable"
    assert error["code"].startswith("ext_proc_error")


def test_the_epps_own_errors_keep_their_body(stack: LocalStack) -> None:
    status, headers, raw = request(f"{stack.envoy_url}/v1/completions", b"{bad")
    assert status == 400 and headers["content-type"] == "application/json"
    assert orjson.loads(raw)["error"]["code"] == "invalid_json"
