"""``epp serve --endpoints-file`` through real Envoy with real simulators: under load,
the file gains a server, loses one (its requests finish: no client error), changes a
role, and is briefly broken (the last good list stays, one clear log line) -- and no
request fails throughout. Every step waits on /status or the log, never on a clock."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from epp_harness.stack import LocalStack
from tests.e2e.conftest import ephemeral
from tests.support.http import request
from tests.support.load import Load
from tests.support.wait import wait_for

BODY = orjson.dumps({"model": "sim-model", "prompt": "hello", "max_tokens": 20})


@pytest.fixture(scope="module")
def endpoints_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("endpoints") / "endpoints.yaml"
    path.write_text("endpoints: []\n")  # the servers' ports are known once they run
    return path


@pytest.fixture(scope="module")
def stack(endpoints_file: Path) -> Iterator[LocalStack]:
    opts = ephemeral(
        servers=3,
        static_endpoints=False,
        sim_args=["--time-scale", "0.2"],
        epp_args=["--endpoints-file", str(endpoints_file), "--endpoints-file-poll-seconds", "0.1"],
    )
    with LocalStack(opts) as s:
        yield s


def write(path: Path, servers: dict[str, str]) -> None:
    """List ``servers`` (address -> role) in the file, replacing it atomically."""
    lines = ["endpoints:"]
    for i, (address, role) in enumerate(servers.items()):
        host, port = address.rsplit(":", 1)
        lines += [
            f"  - name: sim-{i}",
            f'    address: "{host}"',
            f'    port: "{port}"',
            f"    labels: {{llm-d.ai/role: {role}}}",
        ]
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(path)


def pool(stack: LocalStack) -> dict[str, str]:
    """address -> "role/state" as /status shows them."""
    _, _, body = request(f"{stack.epp_http_url}/status")
    return {e["instance"]: f"{e['type']}/{e['state']}" for e in json.loads(body)["endpoints"]}


def epp_log(stack: LocalStack) -> str:
    return (stack.workdir / "epp.log").read_text(errors="replace")


def test_file_edits_apply_under_load_without_a_client_error(
    stack: LocalStack, endpoints_file: Path
) -> None:
    a, b, c = stack.sim_addresses
    assert pool(stack) == {}
    write(endpoints_file, {a: "decode", b: "decode"})
    wait_for(lambda: pool(stack) == {a: "decode/healthy", b: "decode/healthy"}, what="a, b")
    with Load(f"{stack.envoy_url}/v1/completions", [BODY] * 6) as load:
        wait_for(lambda: load.served_by(a) and load.served_by(b), what="load on a and b")

        write(endpoints_file, {a: "decode", b: "decode", c: "decode"})  # gains c
        wait_for(lambda: pool(stack).get(c) == "decode/healthy", what="c to join")
        wait_for(lambda: load.served_by(c), what="c to serve")

        write(endpoints_file, {b: "decode", c: "decode"})  # loses a: it drains
        wait_for(lambda: a not in pool(stack), what="a to drain and go")
        after_a = len(load.results)
        wait_for(lambda: len(load.results) > after_a + 20, what="load after a left")
        assert not load.served_by(a, since=after_a + 6)  # (6: those in flight then)

        write(endpoints_file, {b: "prefill", c: "decode"})  # b changes role
        wait_for(lambda: pool(stack).get(b) == "prefill/healthy", what="b's new role")
        after_b = len(load.results)
        wait_for(lambda: len(load.results) > after_b + 20, what="load after b's change")
        assert all(r.served == c for r in load.results[after_b + 6 :])

        endpoints_file.write_text("endpoints:\n  - address: [\n")  # briefly broken
        wait_for(lambda: "invalid YAML" in epp_log(stack), what="the parse error logged")
        (line,) = [x for x in epp_log(stack).splitlines() if "invalid YAML" in x]
        assert f"endpoints file {endpoints_file}: line 3, column 1: invalid YAML" in line
        assert "keeping the last good list (2 endpoint(s))" in line
        assert pool(stack) == {b: "prefill/healthy", c: "decode/healthy"}
        broken = len(load.results)
        wait_for(lambda: len(load.results) > broken + 20, what="load while broken")

        write(endpoints_file, {a: "decode", b: "decode", c: "decode"})  # valid again
        wait_for(lambda: pool(stack).get(a) == "decode/healthy", what="a back")
        assert pool(stack)[b] == "decode/healthy"
        back = len(load.results)
        wait_for(lambda: load.served_by(a, since=back), what="a to serve again")
    assert load.errors() == [] and len(load.results) > 100
