import random
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from epp.config import build_scheduler
from epp.datastore import Datastore
from epp.errors import NoEndpointError
from epp.scheduling.scheduler import ProfileScheduler
from epp.types import Endpoint, EndpointState, InferenceRequest, Role, Snapshot, parse_host_port

LEAST_REQUEST = (Path(__file__).parents[3] / "configs" / "least-request.yaml").read_text()


def least_request() -> ProfileScheduler:
    return build_scheduler(LEAST_REQUEST)


REQ = InferenceRequest(request_id="r", model="m", path="/v1/completions")


def ep(port: int, role: Role = Role.DECODE) -> Endpoint:
    return Endpoint("10.0.0.1", port, role)


def snap(loads: dict[int, int], roles: dict[int, Role] | None = None) -> Snapshot:
    roles = roles or {}
    states = tuple(EndpointState(ep(p, roles.get(p, Role.DECODE))) for p in loads)
    return Snapshot(states, {f"10.0.0.1:{p}": n for p, n in loads.items()})


def test_picks_the_least_loaded() -> None:
    result = least_request().schedule(REQ, snap({1: 3, 2: 0, 3: 1}), random.Random(0))
    assert result.header_value == "10.0.0.1:2"


def test_ties_are_broken_at_random_over_all_tied() -> None:
    rng = random.Random(1)
    seen = {
        least_request().schedule(REQ, snap({1: 0, 2: 0, 3: 5}), rng).primary.port
        for _ in range(200)
    }
    assert seen == {1, 2}


def test_prefill_only_endpoints_are_not_decode_targets() -> None:
    s = snap({1: 9, 2: 0}, {2: Role.PREFILL})
    assert least_request().schedule(REQ, s, random.Random()).primary.port == 1


def test_empty_pool_is_503() -> None:
    with pytest.raises(NoEndpointError) as info:
        least_request().schedule(REQ, snap({}), random.Random())
    assert info.value.status == 503


@given(st.dictionaries(st.integers(1, 50), st.integers(0, 20), min_size=1), st.integers())
def test_pick_is_always_a_candidate_with_minimal_load(loads: dict[int, int], seed: int) -> None:
    result = least_request().schedule(REQ, snap(loads), random.Random(seed))
    assert result.primary.port in loads
    assert loads[result.primary.port] == min(loads.values())


def test_datastore_accounting_and_snapshots() -> None:
    ds = Datastore()
    changes: list[int] = []
    ds.on_change(lambda: changes.append(1))
    assert ds.add(ep(1)) and not ds.add(ep(1))  # unchanged re-add is a no-op
    s1 = ds.snapshot()
    assert ds.snapshot() is s1  # cached until something changes
    ticket = ds.acquire("10.0.0.1:1")
    assert s1.in_flight["10.0.0.1:1"] == 1  # live view, not a copy
    ticket.release()
    ticket.release()  # second release is a no-op
    assert ds.in_flight("10.0.0.1:1") == 0
    ds.add(ep(2))
    assert ds.snapshot() is not s1 and len(ds.snapshot().endpoints) == 2
    assert len(changes) == 2


def test_removed_endpoint_keeps_its_count_until_requests_finish() -> None:
    ds = Datastore()
    ds.add(ep(1))
    ticket = ds.acquire("10.0.0.1:1")
    assert ds.remove("10.0.0.1:1")
    assert ds.in_flight("10.0.0.1:1") == 1
    ticket.release()
    assert "10.0.0.1:1" not in ds.snapshot().in_flight
    assert not ds.remove("10.0.0.1:1")


@pytest.mark.parametrize(
    ("text", "expected"),
    [("1.2.3.4:80", ("1.2.3.4", 80)), ("[::1]:8000", ("::1", 8000)), ("host:1", ("host", 1))],
)
def test_parse_host_port(text: str, expected: tuple[str, int]) -> None:
    assert parse_host_port(text) == expected


@pytest.mark.parametrize("text", ["1.2.3.4", ":80", "h:0", "h:99999", "h:x", "::1:80", "[::1]80"])
def test_parse_host_port_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="malformed address"):
        parse_host_port(text)


def test_ipv6_address_is_bracketed() -> None:
    assert Endpoint("::1", 80).address == "[::1]:80"


def test_role_parse_accepts_both_alias_and_names_the_choices() -> None:
    from epp.types import Role

    assert Role.parse("both") is Role.BOTH
    assert Role.parse(" Prefill ") is Role.PREFILL
    assert Role.parse("prefill-decode") is Role.BOTH
    with pytest.raises(ValueError, match="use one of: decode, prefill, prefill-decode, both"):
        Role.parse("chef")


def test_snapshots_add_what_peers_have_in_flight_to_the_own_counts() -> None:
    """docs/replicas.md: the scheduler sees own + peers; what is own stays own."""
    ds = Datastore()
    a, b = ep(1), ep(2)
    ds.add(a)
    ds.add(b)
    snapshot = ds.snapshot()
    ticket = ds.acquire(a.address, tokens=10)
    ds.set_peer_load({a.address: (2, 50), "10.9.9.9:1": (1, 5)})
    # the same snapshot object: its views are live
    assert snapshot.in_flight == {a.address: 3, b.address: 0, "10.9.9.9:1": 1}
    assert snapshot.in_flight_tokens[a.address] == 60
    assert dict(ds.own_in_flight) == {a.address: 1, b.address: 0}
    assert ds.in_flight(a.address) == 1 and ds.total_in_flight() == 1
    assert dict(ds.peer_in_flight_table) == {a.address: 2, "10.9.9.9:1": 1}
    ticket.release()
    assert snapshot.in_flight[a.address] == 2 and snapshot.in_flight_tokens[a.address] == 50
    ds.set_peer_load({a.address: (0, 0), "10.9.9.9:1": (0, 0)})
    assert snapshot.in_flight == {a.address: 0, b.address: 0}
    assert dict(ds.peer_in_flight_table) == {}


def test_a_member_with_only_peer_requests_is_removed_at_once_and_keeps_their_count() -> None:
    ds = Datastore()
    a = ep(1)
    ds.add(a)
    ds.set_peer_load({a.address: (2, 0)})
    assert ds.remove(a.address)
    assert ds.member(a.address) is None  # no drain: none of its requests are ours
    assert ds.snapshot().in_flight == {a.address: 2}
    ds.add(a)
    assert ds.snapshot().in_flight[a.address] == 2


def test_peers_freeing_requests_is_heard_as_a_release_and_own_changes_are_told() -> None:
    ds = Datastore()
    a = ep(1)
    ds.add(a)
    releases: list[int] = []
    changes: list[int] = []
    ds.on_release(lambda: releases.append(1))
    ds.on_own_change(lambda: changes.append(1))
    ds.set_peer_load({a.address: (3, 0)})
    assert releases == [] and changes == []
    ds.set_peer_load({a.address: (1, 0)})
    assert releases == [1] and changes == []
    ds.acquire(a.address).release()
    assert changes == [1, 1]
