"""A live EPP's /metrics after traffic: the stack and the requests that make every
series the docs and the dashboard promise appear (routed, disaggregated, streamed,
rejected by the EPP, failed by a model server)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import orjson
from prometheus_client.parser import text_string_to_metric_families

from epp_harness.stack import LocalStack, StackOptions
from tests.support.http import request
from tests.support.wait import wait_for

LONG = "Background for the question that follows. " * 60  # disaggregated
SHORT = "Hi there"  # decode only


@contextmanager
def stack_with_traffic() -> Iterator[LocalStack]:
    """One prefill and one decode simulator (nixl), on ephemeral ports, after one
    request of each kind."""
    opts = StackOptions(
        servers=0, prefill=1, decode=1, envoy_port=0, envoy_admin_port=0, grpc_port=0,
        http_port=0, log_level="warning", sim_args=["--time-scale", "0.05"],
    )  # fmt: skip
    with LocalStack(opts) as stack:
        url = f"{stack.envoy_url}/v1/completions"
        for doc in (
            {"model": "sim-model", "prompt": LONG, "max_tokens": 4},
            {"model": "sim-model", "prompt": SHORT, "max_tokens": 4},
            {
                "model": "sim-model",
                "prompt": SHORT,
                "max_tokens": 4,
                "stream": True,
                "stream_options": {"include_usage": True},
            },
            {"model": "no-such-model", "prompt": SHORT, "max_tokens": 4},  # the server's 404
        ):
            request(url, orjson.dumps(doc), timeout=30)
        request(url, b"{bad", timeout=30)  # the EPP's 400
        # and both endpoints scraped at least once (their load gauges)
        wait_for(
            lambda: len(samples(stack).get("epp_endpoint_queue_depth", [])) == 2,
            what="both endpoints scraped",
        )
        yield stack


def samples(stack: LocalStack) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Every sample of /metrics by sample name (``x_bucket``, ``x_total``, ...)."""
    _, _, body = request(f"{stack.epp_http_url}/metrics")
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return out
