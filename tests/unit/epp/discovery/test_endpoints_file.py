"""The --endpoints-file format (the llm-d Router's file-discovery file), on plain text:
what it lists, and a clear message (with the line) for every bad input."""

from __future__ import annotations

import pytest

from epp.discovery.endpoints_file import MAX_BYTES, EndpointsFileError, parse
from epp.types import Endpoint, Role

LLMD_EXAMPLE = """\
endpoints:
  - name: vllm-0
    address: "10.0.0.1"
    port: "8000"
  - name: vllm-1
    namespace: default
    address: "10.0.0.2"
    port: "8000"
    labels:
      llm-d.ai/role: prefill
      inference.networking.k8s.io/engine-type: sglang
"""


def test_reads_llm_d_s_example() -> None:
    assert parse(LLMD_EXAMPLE, "f") == (
        Endpoint("10.0.0.1", 8000),
        Endpoint(
            "10.0.0.2",
            8000,
            Role.PREFILL,
            {"llm-d.ai/role": "prefill", "inference.networking.k8s.io/engine-type": "sglang"},
            "sglang",
        ),
    )


def test_json_numbers_ipv6_both_and_the_default_engine() -> None:
    entry = '{"address": "::1", "port": 8001, "labels": {"llm-d.ai/role": "both"}}'
    text = '{\n\t"endpoints": [' + entry + "]\n}"
    (e,) = parse(text, "f", engine="trtllm")
    assert (e.address, e.role, e.engine) == ("[::1]:8001", Role.BOTH, "trtllm")
    assert parse("endpoints: []", "f") == ()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("endpoints: [\n", "f: line 2, column 1: invalid YAML: expected the node content"),
        ('{"endpoints": [,]}', "f: line 1, column 16: invalid JSON: Expecting value"),
        ("", "f: empty; expected 'endpoints:' with a list"),
        ("- a", "f: expected a mapping with 'endpoints'"),
        ("endpoints: {}", "f: 'endpoints' must be a list"),
        ("endpoint: []", "f: unknown key(s) ['endpoint']; only 'endpoints'"),
        (
            "endpoints:\n  - address: 10.0.0.1\n    port: 1\n  - address: vllm\n    port: 1\n",
            "f: line 4: endpoints[1].address: must be an IP address (names are not resolved",
        ),
        ("endpoints:\n- {address: 10.0.0.1, port: '0'}", "endpoints[0].port: must be a port"),
        ("endpoints:\n- {address: 10.0.0.1, port: x}", "endpoints[0].port: must be a port"),
        ("endpoints:\n- {address: 10.0.0.1, port: true}", "endpoints[0].port: must be a port"),
        (
            "endpoints:\n- {address: 10.0.0.1}",
            "endpoints[0].port: must be a port 1-65535, got None",
        ),
        (
            "endpoints:\n- address: 10.0.0.1\n  port: 1\n  labels: {llm-d.ai/role: prefil}",
            "f: line 2: endpoints[0].labels.llm-d.ai/role: unknown role 'prefil'",
        ),
        (
            "endpoints:\n- {address: 10.0.0.1, port: 1, labels: "
            "{inference.networking.k8s.io/engine-type: tgi}}",
            "engine-type: 'tgi' is not one of",
        ),
        ("endpoints:\n- {address: 10.0.0.1, port: 1, labels: {a: 1}}", "labels: must map strings"),
        ("endpoints:\n- {address: 10.0.0.1, port: 1, role: decode}", "unknown key(s) ['role']"),
        ("endpoints:\n- {address: 10.0.0.1, port: 1, name: ''}", "name: must be a non-empty"),
        (
            "endpoints:\n- {address: 10.0.0.1, port: 1}\n- {address: 10.0.0.1, port: '1'}",
            "f: line 3: endpoints[1]: 10.0.0.1:1 is listed twice",
        ),
        (
            "endpoints:\n- {name: a, address: 10.0.0.1, port: 1}\n"
            "- {name: a, address: 10.0.0.2, port: 1}",
            "endpoints[1]: name 'a' is also 10.0.0.1:1's",
        ),
        ("endpoints: ['10.0.0.1:1']", "endpoints[0]: expected a mapping"),
    ],
)
def test_every_problem_is_named(text: str, message: str) -> None:
    with pytest.raises(EndpointsFileError) as raised:
        parse(text, "f")
    assert message in str(raised.value)


def test_size_limit() -> None:
    with pytest.raises(EndpointsFileError, match="larger than"):
        parse("#" * (MAX_BYTES + 1), "f")
