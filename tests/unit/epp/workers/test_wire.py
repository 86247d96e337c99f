import asyncio
import dataclasses

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from epp.datastore import Datastore
from epp.types import Endpoint, EndpointMetrics, Role
from epp.workers import wire
from epp.workers.channel import StreamChannel

metrics_st = st.builds(
    EndpointMetrics,
    updated_at=st.floats(0, 1e6),
    waiting=st.none() | st.floats(0, 1e3),
    running=st.none() | st.floats(0, 1e3),
    kv_usage=st.none() | st.floats(0, 1),
    lora_running=st.frozensets(st.text(max_size=5), max_size=3),
    lora_waiting=st.frozensets(st.text(max_size=5), max_size=3),
    max_lora=st.none() | st.integers(0, 8),
    block_size=st.none() | st.integers(1, 64),
    num_blocks=st.none() | st.integers(0, 10**6),
    prefix_cache_queries=st.none() | st.floats(0, 1e9),
    prefix_cache_hits=st.none() | st.floats(0, 1e9),
    started_at=st.none() | st.floats(0, 2e9),
    orca=st.dictionaries(st.text(max_size=8), st.floats(0, 1), max_size=3),
)
endpoint_st = st.builds(
    Endpoint,
    host=st.sampled_from(["10.0.0.1", "::1", "127.0.0.1"]),
    port=st.integers(1, 65535),
    role=st.sampled_from(list(Role)),
    labels=st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3),
    engine=st.sampled_from(["vllm", "sglang"]),
    name=st.sampled_from(["", "server:8000"]),
)


def frame_body(message: wire.Message) -> bytes:
    framed = wire.encode(message)
    (size,) = wire.HEADER.unpack(framed[: wire.HEADER.size])
    assert size == len(framed) - wire.HEADER.size
    return framed[wire.HEADER.size :]


def test_every_field_of_endpoint_metrics_crosses_the_wire() -> None:
    # a field added to EndpointMetrics must be added to WireMetrics (and the strategy)
    names = [f.name for f in dataclasses.fields(EndpointMetrics)]
    assert list(wire.WireMetrics.__struct_fields__) == names


@given(st.lists(metrics_st, max_size=3))
def test_loads_round_trip(reports: list[EndpointMetrics]) -> None:
    sent = wire.Loads(
        [wire.EndpointData(f"10.0.0.{i}:8000", wire.wire_metrics(m)) for i, m in enumerate(reports)]
    )
    got = wire.decode(frame_body(sent))
    assert isinstance(got, wire.Loads)
    assert [wire.metrics(r.metrics) for r in got.reports] == reports
    assert [r.address for r in got.reports] == [r.address for r in sent.reports]


@given(endpoint_st)
def test_members_round_trip_with_every_field(endpoint: Endpoint) -> None:
    store = Datastore()
    store.add(endpoint)
    got = wire.decode(frame_body(wire.members(store.version, store.members())))
    assert isinstance(got, wire.Members) and got.version == store.version
    back = wire.endpoint(got.members[0].endpoint)
    assert back == endpoint and back.name == endpoint.name and back.address == endpoint.address
    assert wire.status(got.members[0]).value == "healthy"


@pytest.mark.parametrize(
    "message",
    [
        wire.Hello(1, 42),
        wire.Ready(9002, 41000, None),
        wire.Ack(7),
        wire.Synced(),
        wire.Objectives({"critical": 5, "batch": -1}),
        wire.Outcome("10.0.0.1:8000", False, "HTTP 503 on the response path", False, True),
    ],
)
def test_every_message_kind_round_trips(message: wire.Message) -> None:
    assert wire.decode(frame_body(message)) == message


def test_garbage_is_a_decode_error() -> None:
    with pytest.raises(msgspec.DecodeError):
        wire.decode(b"\x93\x01\x02")


def test_a_stream_channel_carries_frames_and_reports_the_end() -> None:
    async def main() -> None:
        got: list[wire.Message | None] = []
        done = asyncio.Event()

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            channel = StreamChannel(reader, writer)
            got.append(await channel.receive())
            got.append(await channel.receive())
            got.append(await channel.receive())
            done.set()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = StreamChannel(*await asyncio.open_connection("127.0.0.1", port))
        client.send(wire.Ack(1))
        client.send(wire.Hello(0, 1))
        await asyncio.sleep(0)
        client.close()
        await done.wait()
        server.close()
        assert got == [wire.Ack(1), wire.Hello(0, 1), None]

    asyncio.run(main())
