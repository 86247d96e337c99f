import asyncio
from pathlib import Path

from epp.config import build_scheduler
from epp.datastore import Datastore, Status
from epp.flowcontrol.saturation import WatchedObjectives
from epp.types import Endpoint, EndpointMetrics, InferenceRequest, Role
from epp.workers import wire
from epp.workers.replica import SUCCESS_EVERY_S, SharedSync, WorkerLink, apply_members

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


class Parent:
    """The parent's end of the link, in memory: says ``messages``, then keeps quiet."""

    def __init__(self, *messages: wire.Message) -> None:
        self.queue = list(messages)
        self.sent: list[wire.Message] = []
        self.drained = asyncio.Event()

    def send(self, message: wire.Message) -> None:
        self.sent.append(message)

    def send_frame(self, frame: bytes) -> None:
        raise AssertionError("not used")

    async def receive(self) -> wire.Message | None:
        if not self.queue:
            self.drained.set()
            await asyncio.Event().wait()  # an open link with nothing more to say
        return self.queue.pop(0)

    def close(self) -> None:
        pass


async def test_one_loads_message_updates_every_member_it_names() -> None:
    parent = Datastore()
    parent.add(A)
    parent.add(C)
    a, c = EndpointMetrics(1.0, waiting=2.0), EndpointMetrics(1.0, running=3.0)
    loads = wire.Loads(
        [
            wire.EndpointData(A.address, wire.wire_metrics(a)),
            wire.EndpointData(C.address, wire.wire_metrics(c)),
            wire.EndpointData("10.9.9.9:1", wire.wire_metrics(c)),  # gone meanwhile: dropped
        ]
    )
    worker = Datastore()
    channel = Parent(wire.members(parent.version, parent.members()), loads)
    link = WorkerLink(worker, Path("/unused"), 0, SharedSync(), channel=channel)
    await link.start()  # the membership first; the rest is read in the background
    await asyncio.wait_for(channel.drained.wait(), 5.0)
    await link.stop()
    assert [m.state.metrics for m in worker.members()] == [a, c]
    assert channel.sent[-1] == wire.Ack(parent.version)


async def test_the_scheduler_follows_the_parents_watched_objectives() -> None:
    """A worker runs no discovery: the InferenceObjectives' priorities come from the
    parent, whole each time (one dropped upstream is dropped here too)."""
    objectives = WatchedObjectives()
    seen: list[dict[str, int]] = []
    objectives.on_change(lambda: seen.append(dict(objectives)))
    channel = Parent(
        wire.members(0, []),
        wire.Objectives({"critical": 5, "batch": -1}),
        wire.Objectives({"critical": 5, "batch": -1}),  # unchanged: nobody told
        wire.Objectives({"critical": 7}),
    )
    link = WorkerLink(Datastore(), Path("/unused"), 0, SharedSync(), objectives, channel=channel)
    await link.start()
    await asyncio.wait_for(channel.drained.wait(), 5.0)
    await link.stop()
    assert seen == [{"critical": 5, "batch": -1}, {"critical": 7}]
    scheduler = build_scheduler("{}")
    scheduler.objectives = objectives
    headers = {"x-llm-d-inference-objective": "critical"}
    assert scheduler.priority(InferenceRequest("r", "m", "/", headers=headers)) == 7


def test_successes_are_passed_on_sparingly_and_the_first_after_a_failure_at_once() -> None:
    class Sent:
        def __init__(self) -> None:
            self.messages: list[wire.Message] = []

        def send(self, message: wire.Message) -> None:
            self.messages.append(message)

        def send_frame(self, frame: bytes) -> None:
            raise AssertionError("not used")

        async def receive(self) -> wire.Message | None:
            return None

        def close(self) -> None:
            pass

    now = [100.0]
    channel = Sent()
    link = WorkerLink(
        Datastore(), Path("/unused"), 0, SharedSync(), channel=channel, clock=lambda: now[0]
    )
    for _ in range(5):
        link.success(A.address)
    link.failure(A.address, "HTTP 503", serving=True)
    link.success(A.address)
    now[0] += SUCCESS_EVERY_S * 1.5
    link.success(A.address)
    assert [(m.ok, m.reason) for m in channel.messages if isinstance(m, wire.Outcome)] == [
        (True, ""),
        (False, "HTTP 503"),
        (True, ""),
        (True, ""),
    ]
