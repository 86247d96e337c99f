"""Servers named by host name, through the real Envoy (EDS + override_host): the seed's
``--decode localhost:PORT`` beside an IP literal serves from both; the same server by
name and by address is one member; names through the admin API; ``0.0.0.0`` refused."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from epp_harness.stack import LocalStack
from tests.e2e.conftest import ephemeral
from tests.support.http import request
from tests.support.sim import SimProc, sims
from tests.support.wait import wait_for

KEY = "test-admin-key"
BODY = orjson.dumps({"model": "sim-model", "prompt": "hello", "max_tokens": 2})


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[SimProc]]:
    with sims(tmp_path_factory.mktemp("sims"), [], [], []) as procs:
        yield procs


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, servers: list[SimProc]) -> Iterator[LocalStack]:
    key_file: Path = tmp_path_factory.mktemp("key") / "admin.key"
    key_file.write_text(KEY)
    a, b, _ = servers
    opts = ephemeral(
        servers=0,
        epp_args=[
            "--decode", f"localhost:{a.port}",
            "--decode", f"127.0.0.1:{b.port}",
            "--decode", f"LOCALHOST:{b.port}",
            "--admin-api-key-file", str(key_file),
        ],
    )  # fmt: skip
    with LocalStack(opts) as s:
        yield s


def status(stack: LocalStack) -> dict[str, Any]:
    _, _, body = request(f"{stack.epp_http_url}/status")
    doc: dict[str, Any] = json.loads(body)
    return doc


def served_by(stack: LocalStack, n: int) -> set[str]:
    seen = set()
    for _ in range(n):
        code, headers, body = request(f"{stack.envoy_url}/v1/completions", BODY)
        assert code == 200, body
        seen.add(headers["x-sim-instance"])
    return seen


def test_a_host_name_beside_an_ip_serves_from_both(
    stack: LocalStack, servers: list[SimProc]
) -> None:
    a, b, _ = servers
    members = {e["instance"]: e.get("name") for e in status(stack)["endpoints"]}
    # localhost is 127.0.0.1 (IPv4 first); b given twice (by address and name) is one
    assert members == {f"127.0.0.1:{a.port}": f"localhost:{a.port}", f"127.0.0.1:{b.port}": None}
    wanted = {f"127.0.0.1:{a.port}", f"127.0.0.1:{b.port}"}
    seen: set[str] = set()
    wait_for(lambda: (seen.update(served_by(stack, 4)), wanted <= seen)[1], timeout=20)


def admin(stack: LocalStack, path: str, doc: object) -> tuple[int, Any]:
    code, _, body = request(
        f"{stack.epp_http_url}{path}", orjson.dumps(doc), headers={"X-Api-Key": KEY}
    )
    return code, json.loads(body)


def test_admin_api_takes_names_and_refuses_the_unspecified_address(
    stack: LocalStack, servers: list[SimProc]
) -> None:
    c = servers[2]
    code, doc = admin(stack, "/instances/add", {"type": "decode", "instance": "0.0.0.0:8100"})
    assert code == 400 and doc["error"]["code"] == "invalid_instance"
    assert "give 127.0.0.1" in doc["error"]["message"]
    code, doc = admin(stack, "/instances/add", {"type": "decode", "instance": "nowhere.invalid:1"})
    assert code == 400 and doc["error"]["code"] == "unresolvable_instance"
    code, doc = admin(stack, "/instance/add", {"type": "decode", "instance": f"localhost:{c.port}"})
    assert code == 200, doc
    address = f"127.0.0.1:{c.port}"
    assert doc["results"] == {address: "added"}
    assert doc["message"] == f"add decode instances: ['{address}']."
    assert doc["instance_messages"] == [f"Added {address} to decode_instances."]
    wait_for(lambda: address in served_by(stack, 6), timeout=20)
    # one name that does not resolve: nothing in the call is removed
    both = {"type": "decode", "instances": [f"localhost:{c.port}", "nowhere.invalid:1"]}
    code, doc = admin(stack, "/instances/remove", both)
    assert code == 400 and doc["error"]["code"] == "unresolvable_instance"
    assert address in {e["instance"] for e in status(stack)["endpoints"]}
    code, doc = admin(
        stack, "/instance/remove", {"type": "decode", "instance": f"localhost:{c.port}"}
    )
    assert code == 200 and doc["results"] == {address: "removed"}, doc
    assert doc["message"] == f"remove decode instances: ['{address}']."
