import asyncio

from epp.datalayer.tasks import EndpointTasks
from epp.datastore import Datastore
from epp.types import Endpoint, Role


async def test_tasks_follow_membership() -> None:
    ds = Datastore()
    ds.add(Endpoint("10.0.0.1", 1))
    started: list[str] = []
    cancelled: list[str] = []

    async def loop(endpoint: Endpoint) -> None:
        started.append(f"{endpoint.address}/{endpoint.role.value}")
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(endpoint.address)
            raise

    tasks = EndpointTasks("test", ds, loop)
    tasks.start()
    ds.add(Endpoint("10.0.0.1", 2))
    await asyncio.sleep(0)
    assert tasks.addresses() == ["10.0.0.1:1", "10.0.0.1:2"]
    assert sorted(started) == ["10.0.0.1:1/decode", "10.0.0.1:2/decode"]
    ds.remove("10.0.0.1:1")
    ds.add(Endpoint("10.0.0.1", 2, Role.PREFILL))  # changed endpoint: task restarts
    await asyncio.sleep(0)
    assert tasks.addresses() == ["10.0.0.1:2"]
    assert "10.0.0.1:2/prefill" in started
    assert sorted(cancelled) == ["10.0.0.1:1", "10.0.0.1:2"]
    await tasks.stop()
    assert tasks.addresses() == []
    assert cancelled.count("10.0.0.1:2") == 2
    ds.add(Endpoint("10.0.0.1", 3))  # after stop nothing new starts
    await asyncio.sleep(0)
    assert tasks.addresses() == []
