"""--endpoints-file followed by a real datastore: the first list at start, then edits
(add, remove with draining, role change), a broken or missing file keeping the last
good list with one clear log line, and the file applied again once valid."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from epp.datastore import Datastore, Status
from epp.discovery.file_source import FileSource
from epp.types import Endpoint, Role


class EndpointsFile:
    """The file under test; every write gets a new modification time."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._mtime = 1_000_000_000

    def write(self, *entries: str) -> None:
        self.path.write_text("endpoints:\n" + "".join(f"  - {e}\n" for e in entries))
        self._mtime += 1_000_000_000
        os.utime(self.path, ns=(self._mtime, self._mtime))

    def write_text(self, text: str) -> None:
        self.path.write_text(text)
        self._mtime += 1_000_000_000
        os.utime(self.path, ns=(self._mtime, self._mtime))


A = "{address: 10.0.0.1, port: 8000}"
B = "{address: 10.0.0.2, port: 8000, labels: {llm-d.ai/role: prefill}}"
B_DECODES = "{address: 10.0.0.2, port: 8000, labels: {llm-d.ai/role: decode}}"
C = "{address: 10.0.0.3, port: 8000}"


@pytest.fixture
def file(tmp_path: Path) -> EndpointsFile:
    return EndpointsFile(tmp_path / "endpoints.yaml")


def roles(ds: Datastore) -> dict[str, str]:
    return {m.address: f"{m.endpoint.role.value}/{m.status.value}" for m in ds.members()}


async def started(file: EndpointsFile, ds: Datastore) -> FileSource:
    source = FileSource(file.path, ds, poll_s=0, engine="vllm")
    await source.start()
    return source


async def test_edits_apply_and_removed_servers_drain(file: EndpointsFile) -> None:
    ds = Datastore()
    file.write(A, B)
    source = await started(file, ds)
    assert roles(ds) == {"10.0.0.1:8000": "decode/healthy", "10.0.0.2:8000": "prefill/healthy"}
    assert not await source.check()  # unchanged: nothing to do
    ticket = ds.acquire("10.0.0.1:8000")
    file.write(B_DECODES, C)
    assert await source.check()
    assert roles(ds) == {
        "10.0.0.1:8000": "decode/draining",
        "10.0.0.2:8000": "decode/healthy",
        "10.0.0.3:8000": "decode/healthy",
    }
    ticket.release()  # its last request ends: it goes
    assert "10.0.0.1:8000" not in roles(ds)
    file.write_text(file.path.read_text())  # touched, same content
    assert not await source.check()


async def test_broken_or_missing_file_keeps_the_last_good_list(
    file: EndpointsFile, caplog: pytest.LogCaptureFixture
) -> None:
    ds = Datastore()
    file.write(A, B)
    source = await started(file, ds)
    before = roles(ds)
    file.write_text("endpoints:\n  - {address: 10.0.0.1, port: 8000}\n  - address: [\n")
    with caplog.at_level(logging.ERROR):
        assert not await source.check()
        assert not await source.check()
    assert roles(ds) == before
    (line,) = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert "line 4, column 1: invalid YAML" in line
    assert "keeping the last good list (2 endpoint(s))" in line
    caplog.clear()
    file.write(A, "{address: 10.0.0.2, port: 8000, labels: {llm-d.ai/role: prefil}}")
    with caplog.at_level(logging.ERROR):
        assert not await source.check()
    assert "line 3: endpoints[1].labels.llm-d.ai/role: unknown role 'prefil'" in caplog.text
    caplog.clear()
    file.path.unlink()
    with caplog.at_level(logging.ERROR):
        assert not await source.check()
    assert "No such file or directory; keeping the last good list" in caplog.text
    assert roles(ds) == before
    file.write(A, C)  # back, valid: applied
    assert await source.check()
    assert roles(ds) == {"10.0.0.1:8000": "decode/healthy", "10.0.0.3:8000": "decode/healthy"}


async def test_a_file_that_is_not_usable_at_start_stops_the_start(file: EndpointsFile) -> None:
    with pytest.raises(OSError, match="No such file or directory"):
        await started(file, Datastore())
    file.write_text("endpoints:\n  - {address: vllm, port: 8000}\n")
    with pytest.raises(OSError, match=r"line 2: endpoints\[0\].address: must be an IP"):
        await started(file, Datastore())


async def test_flag_endpoints_are_left_alone(file: EndpointsFile) -> None:
    ds = Datastore()
    ds.add(Endpoint("10.0.0.9", 8000, Role.PREFILL))  # e.g. --prefill 10.0.0.9:8000
    file.write(A)
    source = await started(file, ds)
    file.write()
    assert await source.check()
    assert roles(ds) == {"10.0.0.9:8000": "prefill/healthy"}
    member = ds.member("10.0.0.9:8000")
    assert member is not None and member.status is Status.ACTIVE
