"""Which server holds which LoRA adapter, with plain data: listings replace what a
server holds, loads and unloads adjust it, the least recently routed adapter comes
first, a server never listed is judged by its running/waiting report, a response that
casts doubt names the right server, and a /v1/models answer is read as vLLM writes it."""

from __future__ import annotations

from typing import Any

import pytest

from epp.lora.holdings import Holdings, doubted, listed_adapters, with_holders
from epp.types import Endpoint, EndpointMetrics, EndpointState, Role

A, B, C = "10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"


def state(address: str, running: frozenset[str] = frozenset()) -> EndpointState:
    host, port = address.split(":")
    metrics = EndpointMetrics(0.0, lora_running=running, max_lora=2)
    return EndpointState(Endpoint(host, int(port)), metrics)


POOL = (state(A), state(B), state(C))


def test_a_listing_is_what_the_server_holds_now() -> None:
    h = Holdings()
    h.listed(A, ["a1", "a2"])
    h.listed(B, ["a2"])
    assert h.holders("a1", POOL) == {A}
    assert h.holders("a2", POOL) == {A, B}
    assert h.lists("a1") and h.lists("a2") and not h.lists("sim-model")
    h.listed(A, ["a2"])  # a1 is gone from A: nobody lists it any more
    assert h.holders("a1", POOL) == frozenset() and not h.lists("a1")
    assert h.listing() == {A: ["a2"], B: ["a2"]}


def test_only_the_servers_of_the_pool_are_holders() -> None:
    h = Holdings()
    h.listed(A, ["a1"])
    h.listed(B, ["a1"])
    assert h.holders("a1", [state(B)]) == {B}  # A is not in the pool (ejected, draining)


def test_loads_unloads_and_a_server_that_leaves() -> None:
    h = Holdings()
    h.listed(A, [])
    h.add(A, "a1")
    assert h.holders("a1", POOL) == {A}
    assert h.remove(A, "a1") and not h.remove(A, "a1")  # the second: it was not there
    assert h.knows(A) and h.held(A) == []
    h.add(B, "a2")
    h.forget(B)
    assert not h.knows(B) and not h.lists("a2") and h.listing() == {A: []}


def test_the_least_recently_routed_adapter_comes_first_and_a_listing_keeps_the_order() -> None:
    h = Holdings()
    h.listed(A, ["a1", "a2", "a3"])
    h.touch(A, "a1")
    assert h.held(A) == ["a2", "a3", "a1"]
    h.listed(A, ["a4", "a1", "a2"])  # a3 unloaded behind the EPP's back, a4 loaded
    assert h.held(A) == ["a2", "a1", "a4"]
    h.touch(A, "nope")  # not held there: nothing happens
    assert h.held(A) == ["a2", "a1", "a4"]


def test_the_fallback_list_is_filled_up_with_the_other_holders_least_busy_first() -> None:
    ends = [state(A), state(B), state(C), EndpointState(Endpoint("10.0.0.4", 8000, Role.PREFILL))]
    holders = frozenset({A, B, C, "10.0.0.4:8000"})
    first = (ends[0].endpoint,)
    out = with_holders(first, holders, ends, {B: 2, C: 1}, 3)
    assert [e.address for e in out] == [A, C, B]  # prefill-only 10.0.0.4 never decodes
    assert [e.address for e in with_holders(first, holders, ends, {}, 2)] == [A, B]
    assert with_holders(first, frozenset({A}), ends, {}, 3) == first  # A is the only one
    full = (ends[1].endpoint, ends[0].endpoint)
    assert with_holders(full, holders, ends, {}, 2) == full


def test_a_server_never_listed_holds_what_it_reports_running_or_waiting() -> None:
    h = Holdings()
    h.listed(A, [])  # listed: its listing wins over a report that may lag an unload
    waiting = EndpointMetrics(0.0, lora_waiting=frozenset({"a1"}))
    reports = [
        state(A, frozenset({"a1"})),
        state(B, frozenset({"a1"})),
        EndpointState(Endpoint("10.0.0.3", 8000), waiting),
        EndpointState(Endpoint("10.0.0.4", 8000), None),
    ]
    assert h.holders("a1", reports) == {B, C}


@pytest.mark.parametrize(
    ("status", "served", "doubt"),
    [
        (200, "", ()),  # answered where it was sent (Envoy did not say)
        (200, A, ()),
        (200, B, (A,)),  # Envoy answered from the next of the list: A failed (a 404?)
        (404, "", (A,)),  # "The model `a1` does not exist."
        (404, A, (A,)),
        (404, B, (A, B)),  # both failed
        (500, A, ()),  # a server error says nothing about the adapter
    ],
)
def test_what_a_response_casts_doubt_on(status: int, served: str, doubt: tuple[str, ...]) -> None:
    assert doubted(A, status, served) == doubt


def test_a_vllm_model_list_names_its_adapters() -> None:
    doc = {
        "object": "list",
        "data": [
            {"id": "base", "object": "model", "root": "base", "parent": None},
            {"id": "a1", "object": "model", "root": "/adapters/a1", "parent": "base"},
            {"id": "a2", "object": "model", "root": "/adapters/a2", "parent": "base"},
            {"id": 7, "parent": "base"},  # no string id: skipped
            "junk",
        ],
    }
    assert listed_adapters(doc) == ["a1", "a2"]
    assert listed_adapters({"data": []}) == []


@pytest.mark.parametrize("doc", [None, [], {"error": {"message": "x"}}, {"data": "x"}])
def test_anything_but_a_model_list_is_refused(doc: Any) -> None:
    with pytest.raises(ValueError, match="no 'data' list"):
        listed_adapters(doc)
