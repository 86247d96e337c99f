"""The change from one endpoint list to the next, on plain data."""

from __future__ import annotations

from epp.datastore import Datastore, Status
from epp.discovery.membership_diff import MembershipDiff, apply, diff
from epp.types import Endpoint, Role

A = Endpoint("10.0.0.1", 8000)
B = Endpoint("10.0.0.2", 8000, Role.PREFILL)
C = Endpoint("10.0.0.3", 8000)


def by_address(*endpoints: Endpoint) -> dict[str, Endpoint]:
    return {e.address: e for e in endpoints}


def test_adds_removes_and_role_changes() -> None:
    b_decodes = Endpoint("10.0.0.2", 8000, Role.DECODE)
    change = diff(by_address(A, B), by_address(b_decodes, C))
    assert change == MembershipDiff(added=(C,), changed=(b_decodes,), removed=(A.address,))
    assert change.summary() == (
        "1 added (10.0.0.3:8000), 1 changed (10.0.0.2:8000 now decode), 1 removed (10.0.0.1:8000)"
    )


def test_same_list_is_no_change_and_labels_count() -> None:
    assert not diff(by_address(A, B), by_address(B, A))
    assert diff({}, {}).summary() == "no change"
    labelled = Endpoint("10.0.0.1", 8000, labels={"zone": "a"})
    assert diff(by_address(A), by_address(labelled)).changed == (labelled,)
    sglang = Endpoint("10.0.0.1", 8000, engine="sglang")
    assert diff(by_address(A), by_address(sglang)).changed == (sglang,)


def test_apply_drains_what_has_requests_in_flight() -> None:
    ds = Datastore()
    apply(ds, diff({}, by_address(A, B)))
    ticket = ds.acquire(A.address)
    apply(ds, diff(by_address(A, B), by_address(B)))
    member = ds.member(A.address)
    assert member is not None and member.status is Status.DRAINING
    ticket.release()
    assert ds.member(A.address) is None and ds.member(B.address) is not None
