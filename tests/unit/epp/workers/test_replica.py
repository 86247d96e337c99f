from epp.datastore import Datastore, Status
from epp.types import Endpoint, Role
from epp.workers import wire
from epp.workers.replica import apply_members

A = Endpoint("10.0.0.1", 8000)
B = Endpoint("10.0.0.2", 8000, Role.PREFILL)
C = Endpoint("10.0.0.3", 8000)


def statuses(store: Datastore) -> dict[str, Status]:
    return {m.address: m.status for m in store.members()}


def test_a_replica_follows_the_parents_membership_and_statuses() -> None:
    parent, worker = Datastore(), Datastore()
    parent.add(A)
    parent.add(B)
    parent.add(C, waiting=True)
    apply_members(worker, wire.members(parent.version, parent.members()))
    assert statuses(worker) == statuses(parent)
    parent.eject(A.address)
    parent.add(C)
    apply_members(worker, wire.members(parent.version, parent.members()))
    assert statuses(worker) == statuses(parent)
    assert worker.snapshot().state(B.address) is not None
    parent.reinstate(A.address)
    parent.remove(B.address)
    apply_members(worker, wire.members(parent.version, parent.members()))
    assert statuses(worker) == statuses(parent)


def test_a_member_the_parent_drops_drains_in_the_worker_while_it_has_requests() -> None:
    parent, worker = Datastore(), Datastore()
    parent.add(A)
    apply_members(worker, wire.members(parent.version, parent.members()))
    ticket = worker.acquire(A.address)
    parent.remove(A.address)  # the parent routes nothing: gone at once there
    apply_members(worker, wire.members(parent.version, parent.members()))
    assert statuses(worker) == {A.address: Status.DRAINING}
    apply_members(worker, wire.members(parent.version, parent.members()))  # again: still
    assert statuses(worker) == {A.address: Status.DRAINING}
    ticket.release()
    assert statuses(worker) == {}
