"""Active-active replicas (docs/replicas.md): two `epp serve` processes, each an endpoint
of Envoy's ext_proc cluster, following the same simulators and their KV events, agree
on a prefix's home: whichever replica Envoy hands a request to, it goes to the server
that holds the prefix, though only one of them routed the prompt there."""

from __future__ import annotations

from pathlib import Path

import pytest

from epp_harness.stack import HOST, LocalStack
from tests.e2e.conftest import ephemeral
from tests.e2e.test_precise_prefix import BS, FULL, PROMPT, complete, sample
from tests.support.http import request
from tests.support.wait import wait_for

pytestmark = pytest.mark.e2e

PRECISE = Path(__file__).resolve().parents[2] / "configs" / "precise-prefix.yaml"


def replica_metrics(stack: LocalStack) -> list[str]:
    return [request(f"http://{HOST}:{http}/metrics")[2].decode() for _, http in stack.epp_ports]


def test_two_replicas_agree_on_a_prefix_home_through_their_kv_events(tmp_path: Path) -> None:
    opts = ephemeral(
        servers=3,
        replicas=2,
        kv_events=True,
        sim_args=["--time-scale", "0"],
        epp_args=["--config", str(PRECISE)],
        workdir=tmp_path,
    )
    with LocalStack(opts) as stack:
        assert len(stack.epp_ports) == 2 and len({p for p, _ in stack.epp_ports}) == 2
        first, _ = complete(stack.envoy_url, PROMPT)  # one replica picks the home
        home = next(s for s in stack.sims if s.info["instance"] == first)
        where = f'endpoint="{home.info["host"]}:{home.info["port"]}"'
        wait_for(
            lambda: all(
                sample(text, "epp_kv_index_blocks", where, 'medium="GPU"') >= FULL
                for text in replica_metrics(stack)
            ),
            timeout=20,
            what="the prompt's blocks in both replicas' indexes",
        )
        questions = ["Why?", "When?", "Where?", "How high?", "How often?", "Who?"]
        for question in questions:
            again, cached = complete(stack.envoy_url, f"{PROMPT} {question}")
            assert (again, cached) == (first, FULL * BS)
        texts = replica_metrics(stack)
        # Envoy spread the streams over both replicas, and each one's in-flight
        # accounting is back to zero
        streams = [sample(t, "epp_requests_total") for t in texts]
        assert sum(streams) == len(questions) + 1 and min(streams) >= 2, streams
        assert all(sample(t, "epp_in_flight_requests") == 0 for t in texts)
        # they share their in-flight counts (docs/replicas.md): each follows the other,
        # and what it heard from it is back to zero too
        assert all(sample(t, "epp_peers") == 1 for t in texts)
        wait_for(
            lambda: all(
                sample(t, "epp_peer_in_flight_requests") == 0 for t in replica_metrics(stack)
            ),
            what="the peers' counts back to zero (the last release's frame)",
        )
