"""Scaling at runtime through real Envoy (EDS + override_host) and real simulators:
add, remove with draining, waiting for a server that is not up yet, a server killed
under load (no client error, ejected, back after a restart), Envoy's EDS view."""

from __future__ import annotations

import json
import signal
import socket
import time
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from epp_harness.procs import ManagedProcess
from epp_harness.stack import LocalStack
from tests.e2e.conftest import ephemeral
from tests.support.envoy_admin import host_health
from tests.support.http import open_raw_post, request
from tests.support.load import Load
from tests.support.wait import wait_for

KEY = "test-admin-key"
AUTH = {"X-Api-Key": KEY}
BODY = orjson.dumps({"model": "sim-model", "prompt": "hello", "max_tokens": 20})


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    key_file = tmp_path_factory.mktemp("key") / "admin.key"
    key_file.write_text(KEY + "\n")
    opts = ephemeral(
        servers=2,
        sim_args=["--time-scale", "0.2"],
        epp_args=[
            "--admin-api-key-file", str(key_file),
            "--model", "sim-model",
            "--waiting-retry-interval", "0.2",
            "--max-waiting-retries", "100",
            "--eject-backoff-seconds", "0.3",
            "--max-eject-backoff-seconds", "0.6",
            "--remove-after-seconds", "0",
        ],
    )  # fmt: skip
    with LocalStack(opts) as s:
        yield s


def admin(
    stack: LocalStack, path: str, doc: object, headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    status, _, body = request(
        f"{stack.epp_http_url}{path}",
        orjson.dumps(doc),
        headers=AUTH if headers is None else headers,
    )
    return status, json.loads(body)


def states(stack: LocalStack) -> dict[str, str]:
    _, _, body = request(f"{stack.epp_http_url}/status")
    return {e["instance"]: e["state"] for e in json.loads(body)["endpoints"]}


def envoy_hosts(stack: LocalStack) -> dict[str, str]:
    """model_servers hosts Envoy holds (from EDS) -> their health flags."""
    assert stack.envoy is not None
    return host_health(stack.envoy.admin_url, "model_servers")


def served_by(stack: LocalStack) -> str:
    status, headers, body = request(f"{stack.envoy_url}/v1/completions", BODY)
    assert status == 200, body
    return headers["x-sim-instance"]


def new_sim(stack: LocalStack, name: str, port: int = 0) -> tuple[ManagedProcess, str]:
    sim = stack.start_sim(name, "--port", str(port))
    stack.sims.append(sim)  # stopped with the stack
    info = sim.wait_ready()
    return sim, f"{info['host']}:{info['port']}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_mutating_calls_need_the_key(stack: LocalStack) -> None:
    doc = {"type": "decode", "instance": "127.0.0.1:1"}
    assert admin(stack, "/instances/add", doc, headers={})[0] == 401
    status, body = admin(stack, "/instances/remove", doc, headers={"X-Api-Key": "wrong"})
    assert status == 403 and body["error"]["code"] == "invalid_api_key"
    status, body = admin(stack, "/instances/add", {"type": "decode", "instance": "nope"})
    assert status == 400 and "malformed address 'nope'" in body["error"]["message"]
    for method_body in (None, b"{}"):  # GET and POST /status are open
        status, _, raw = request(f"{stack.epp_http_url}/status", method_body, headers={})
        assert status == 200 and json.loads(raw)["decode_node_count"] >= 2


def test_added_instance_gets_traffic_and_envoy_learns_it(stack: LocalStack) -> None:
    _, address = new_sim(stack, "added")
    status, body = admin(stack, "/instances/add", {"type": "decode", "instance": address})
    assert status == 200 and body["results"] == {address: "added"}
    assert address in body["current_decode_instances"]
    wait_for(lambda: envoy_hosts(stack).get(address) == "healthy", what="EDS update in Envoy")
    wait_for(lambda: served_by(stack) == address, what="the added server to serve")
    status, body = admin(stack, "/instances/add", {"type": "decode", "instance": address})
    assert body["results"] == {address: "already exists"}
    assert "already present" in body["message"]


def test_removed_instance_drains_then_goes(stack: LocalStack) -> None:
    _, address = new_sim(stack, "removed")
    admin(stack, "/instances/add", {"type": "decode", "instance": address})
    wait_for(lambda: envoy_hosts(stack).get(address) == "healthy", what="EDS update in Envoy")
    long = orjson.dumps({"model": "sim-model", "prompt": "long", "max_tokens": 400, "stream": True})
    held: socket.socket | None = None
    others = []
    for _ in range(100):  # open streams until one lands on the new server
        sock = open_raw_post(stack.envoy_url, "/v1/completions", long, close=True)
        head = sock.recv(4096).decode(errors="replace")
        if f"x-sim-instance: {address}" in head.lower():
            held = sock
            break
        others.append(sock)
    for sock in others:
        sock.close()
    assert held is not None, "no stream reached the new server"
    status, body = admin(stack, "/instances/remove", {"type": "decode", "instance": address})
    assert status == 200 and body["results"] == {address: "draining"}
    assert states(stack)[address] == "draining"
    print("envoy while draining:", envoy_hosts(stack).get(address))
    wait_for(
        lambda: envoy_hosts(stack).get(address, "gone") != "healthy",
        what="Envoy to stop picking it",
    )
    assert all(served_by(stack) != address for _ in range(20))  # no new picks
    rest = b""
    while chunk := held.recv(65536):  # the in-flight stream runs to its end
        rest += chunk
    held.close()
    assert b"data: [DONE]" in rest
    wait_for(lambda: address not in states(stack), what="the drained server to go")
    wait_for(lambda: address not in envoy_hosts(stack), what="Envoy to drop it")
    status, body = admin(stack, "/instances/remove", {"type": "decode", "instance": address})
    assert status == 404 and "not in the decode instances" in body["message"]


def test_instance_not_started_yet_waits_then_joins(stack: LocalStack) -> None:
    port = free_port()
    address = f"127.0.0.1:{port}"
    status, body = admin(stack, "/instances/add", {"type": "decode", "instances": [address]})
    assert status == 202 and body["results"] == {address: "waiting to start"}
    assert states(stack)[address] == "waiting" and address not in envoy_hosts(stack)
    new_sim(stack, "late", port)
    wait_for(lambda: states(stack).get(address) == "healthy", what="the late server to join")
    wait_for(lambda: served_by(stack) == address, what="the late server to serve")


def test_killed_server_costs_no_client_error_and_comes_back(stack: LocalStack) -> None:
    victim, address = new_sim(stack, "victim")
    admin(stack, "/instances/add", {"type": "decode", "instance": address})
    wait_for(lambda: envoy_hosts(stack).get(address) == "healthy", what="EDS update in Envoy")
    with Load(f"{stack.envoy_url}/v1/completions", [BODY] * 6) as load:
        wait_for(lambda: load.served_by(address), what="load on the victim")
        victim.proc.send_signal(signal.SIGKILL)  # type: ignore[union-attr]
        victim.proc.wait()  # type: ignore[union-attr]
        killed = time.monotonic()
        wait_for(lambda: states(stack)[address] == "ejected", timeout=60, what="ejection")
        ejected_after = time.monotonic() - killed
        wait_for(lambda: "failed_eds_health" in envoy_hosts(stack)[address], what="EDS: unhealthy")
        served_while_dead = len(load.results)
        wait_for(lambda: len(load.results) > served_while_dead + 30, what="load after the kill")
        new_sim(stack, "victim-again", int(address.rsplit(":", 1)[1]))
        wait_for(lambda: states(stack)[address] == "healthy", what="reinstatement")
        wait_for(lambda: envoy_hosts(stack)[address] == "healthy", what="EDS: healthy")
        back = len(load.results)
        wait_for(lambda: load.served_by(address, since=back), what="traffic again")
    errors = load.errors()
    # the numbers bench/results/README.md quotes (run with -s to see them)
    print(f"kill test: {len(load.results)} requests, {len(errors)} errors, ", end="")
    print(f"ejected {ejected_after:.3f}s after the kill")
    assert errors == [] and len(load.results) > 50
    # ejected by the failed requests themselves, well before a periodic check would:
    # a wide margin, as the machine running the test may be busy
    assert ejected_after < 10.0


def test_envoy_eds_view_matches_the_datastore(stack: LocalStack) -> None:
    expected = {a: s for a, s in states(stack).items() if s != "waiting"}
    flags = {
        "healthy": "healthy",
        "ejected": "/failed_eds_health",
        "draining": "/eds_status_draining",
    }
    wait_for(
        lambda: (
            {a: f for a, f in envoy_hosts(stack).items()}
            == {a: flags[s] for a, s in expected.items()}
        ),
        what="Envoy's hosts to equal the EPP's members",
    )


def test_original_dst_config_gets_exactly_one_address() -> None:
    with LocalStack(ephemeral(servers=2, cluster="original-dst")) as plain:
        status, headers, _ = request(f"{plain.envoy_url}/v1/completions", BODY)
        assert status == 200
        served = headers["x-sim-instance"]
        _, _, raw = request(f"http://{served}/sim/last-request")
        assert json.loads(raw)["headers"]["x-gateway-destination-endpoint"] == served


def test_client_routed_envoy_goes_where_the_header_says() -> None:
    """No EPP, ORIGINAL_DST: the client's destination header picks the server (the
    routing benchmark's oracle), and the simulators report cached tokens."""
    opts = ephemeral(servers=2, cluster="original-dst", epp=False)
    with LocalStack(opts) as routed:
        assert routed.epp is None
        body = orjson.dumps({"model": "sim-model", "prompt": "p" * 200, "max_tokens": 2})
        for target in [*routed.sim_addresses, *reversed(routed.sim_addresses)]:
            header = {"x-gateway-destination-endpoint": target}
            status, headers, raw = request(f"{routed.envoy_url}/v1/completions", body, header)
            assert (status, headers["x-sim-instance"]) == (200, target)
        # the second visit to each server found the prompt's 3 full blocks cached
        assert json.loads(raw)["usage"]["prompt_tokens_details"] == {"cached_tokens": 48}
