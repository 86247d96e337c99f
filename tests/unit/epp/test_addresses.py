"""Addresses as users write them: canonical IPs, host names resolved to one address and
followed, the unspecified addresses refused, EDS never sent an address Envoy rejects,
and the seeds' ways of naming several servers at once."""

from __future__ import annotations

import argparse
import logging
import socket

import pytest

from epp.cli import build_parser
from epp.common.addresses import canonical_host, parse_address, pick
from epp.datastore import Datastore, Status
from epp.discovery import static
from epp.discovery.names import NameResolver, ResolveError
from epp.discovery.runtime import RuntimeMembership, WaitPolicy
from epp.types import Endpoint, Role
from epp.xds.eds import MODEL_CLUSTER, load_assignment

V4, V6 = socket.AF_INET, socket.AF_INET6


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("127.0.0.1:8100", ("127.0.0.1", 8100)),
        ("[0:0::1]:8100", ("::1", 8100)),
        ("[::ffff:10.0.0.1]:80", ("10.0.0.1", 80)),
        ("LocalHost:8100", ("localhost", 8100)),
        ("vllm-0.vllm.default.svc.:8000", ("vllm-0.vllm.default.svc", 8000)),
    ],
)  # fmt: skip
def test_addresses_are_canonical(text: str, parsed: tuple[str, int]) -> None:
    assert parse_address(text) == parsed


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("0.0.0.0:8100", "0.0.0.0 means 'any address'"),
        ("[::]:8100", ":: means 'any address'"),
        ("[::ffff:0.0.0.0]:8100", "give 127.0.0.1"),
        ("ho_st:80", "neither an IP address nor a host name"),
        ("-bad.example:80", "neither an IP address nor a host name"),
        ("localhost", "expected host:port"),
        ("localhost:0", "port must be 1-65535"),
    ],
)
def test_bad_addresses_say_what_is_wrong(text: str, words: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_address(text)
    assert words in str(info.value) and repr(text) in str(info.value)


def test_a_name_stands_for_its_first_ipv4_address() -> None:
    assert pick([(V6, "::1"), (V4, "127.0.0.1")]) == "127.0.0.1"
    assert pick([(V6, "fe80::1%eth0"), (V6, "::1")]) == "fe80::1"
    assert pick([(V4, "0.0.0.0"), (V6, "::2")]) == "::2"  # unusable results skipped
    assert pick([]) is None
    assert canonical_host("::ffff:127.0.0.1") == "127.0.0.1"


def test_eds_leaves_out_only_the_member_envoy_would_reject() -> None:
    ds = Datastore()
    ds.add(Endpoint("localhost", 8100))  # cannot happen through our sources; a guard
    ds.add(Endpoint("127.0.0.1", 8101))
    ds.add(Endpoint("0.0.0.0", 8102))
    left_out: dict[str, str] = {}
    cla = load_assignment(MODEL_CLUSTER, ds.members(), left_out)
    sent = [e.endpoint.address.socket_address for e in cla.endpoints[0].lb_endpoints]
    assert [(a.address, a.port_value) for a in sent] == [("127.0.0.1", 8101)]
    assert set(left_out) == {"localhost:8100", "0.0.0.0:8102"}
    assert "not an IP address" in left_out["localhost:8100"]


async def test_localhost_resolves_to_one_ipv4_member_shared_with_its_literal() -> None:
    ds = Datastore()
    names = NameResolver(ds)  # the system's resolver
    await names.add_static(Endpoint("localhost", 8100, Role.PREFILL))
    await names.add_static(Endpoint("127.0.0.1", 8100, Role.PREFILL))
    [member] = ds.members()
    assert member.address == "127.0.0.1:8100" and member.endpoint.name == "localhost:8100"
    with pytest.raises(ResolveError, match=r"cannot resolve 'no-such-host\.invalid:1'"):
        await names.resolve(Endpoint("no-such-host.invalid", 1))


class Dns:
    """A stand-in resolver whose answers the test changes (DNS cannot be re-pointed
    from a test); injected through NameResolver's ``lookup`` seam."""

    def __init__(self) -> None:
        self.answers: dict[str, list[tuple[int, str]]] = {}

    async def lookup(self, host: str, port: int) -> list[tuple[int, str]]:
        if host not in self.answers:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return self.answers[host]


async def test_a_changed_address_replaces_the_old_which_drains() -> None:
    dns, ds = Dns(), Datastore()
    dns.answers["vllm-0"] = [(V4, "10.0.0.1")]
    names = NameResolver(ds, lookup=dns.lookup)
    await names.add_static(Endpoint("vllm-0", 8000, Role.DECODE, {"zone": "a"}))
    ticket = ds.acquire("10.0.0.1:8000")
    dns.answers["vllm-0"] = [(V6, "fd00::2"), (V4, "10.0.0.2")]
    await names.refresh()
    old, new = ds.member("10.0.0.1:8000"), ds.member("10.0.0.2:8000")
    assert old is not None and old.status is Status.DRAINING
    assert new is not None and new.status is Status.ACTIVE
    assert new.endpoint.labels == {"zone": "a"} and new.endpoint.name == "vllm-0:8000"
    ticket.release()
    assert ds.member("10.0.0.1:8000") is None
    del dns.answers["vllm-0"]  # a DNS failure keeps the address it had
    await names.refresh()
    assert [m.address for m in ds.members()] == ["10.0.0.2:8000"]
    ds.remove("10.0.0.2:8000")  # gone from the pool: no longer followed
    dns.answers["vllm-0"] = [(V4, "10.0.0.3")]
    await names.refresh()
    assert ds.members() == []


async def test_a_removed_name_draining_its_requests_is_not_brought_back_by_dns() -> None:
    dns, ds = Dns(), Datastore()
    dns.answers["vllm-0"] = [(V4, "10.0.0.1")]
    names = NameResolver(ds, lookup=dns.lookup)
    await names.add_static(Endpoint("vllm-0", 8000))
    ticket = ds.acquire("10.0.0.1:8000")
    ds.remove("10.0.0.1:8000")  # removed while a request runs: draining
    dns.answers["vllm-0"] = [(V4, "10.0.0.2")]
    await names.refresh()
    assert ds.member("10.0.0.2:8000") is None
    ticket.release()


async def test_a_static_name_that_does_not_resolve_yet_joins_when_it_does(
    caplog: pytest.LogCaptureFixture,
) -> None:
    dns, ds = Dns(), Datastore()
    names = NameResolver(ds, lookup=dns.lookup)
    with caplog.at_level(logging.WARNING):
        await names.add_static(Endpoint("later", 8000))
    assert "cannot resolve 'later:8000'" in caplog.text and "joins when it resolves" in caplog.text
    assert ds.members() == []
    dns.answers["later"] = [(V4, "10.0.0.9")]
    await names.refresh()
    assert [m.address for m in ds.members()] == ["10.0.0.9:8000"]


async def test_runtime_added_name_is_followed_and_kept_by_name(tmp_path: object) -> None:
    dns, ds = Dns(), Datastore()
    dns.answers["p0"] = [(V4, "10.0.0.1")]
    names = NameResolver(ds, lookup=dns.lookup)

    async def ready(_address: str) -> None:
        return None

    membership = RuntimeMembership(ds, ready, WaitPolicy(), resolver=names)
    await membership.add(Endpoint("p0", 8100, Role.PREFILL))
    assert [m.address for m in ds.members()] == ["10.0.0.1:8100"]
    dns.answers["p0"] = [(V4, "10.0.0.7")]
    await names.refresh()
    member = ds.member("10.0.0.7:8100")
    assert member is not None and member.endpoint.role is Role.PREFILL
    assert [m.address for m in ds.members()] == ["10.0.0.7:8100"]


def _serve_args(*argv: str) -> argparse.Namespace:
    return build_parser("serve").parse_args(["serve", *argv])


def test_several_addresses_after_one_flag_and_the_vllm_ascend_flags() -> None:
    args = _serve_args(
        "--prefill", "localhost:8100", "localhost:8101", "--decode", "127.0.0.1:8200",
        "--decode", "[::1]:8201",
        "--prefiller-hosts", "127.0.0.1", "10.0.0.2", "--prefiller-ports", "8102", "8103",
        "--decoder-hosts", "::1", "--decoder-ports", "8202",
        "--max-waiting-retries", "3", "--waiting-retry-interval", "10",
    )  # fmt: skip
    got = [(e.address, e.role) for e in static.endpoints(args)]
    assert got == [
        ("localhost:8100", Role.PREFILL),
        ("localhost:8101", Role.PREFILL),
        ("127.0.0.1:8200", Role.DECODE),
        ("[::1]:8201", Role.DECODE),
        ("127.0.0.1:8102", Role.PREFILL),
        ("10.0.0.2:8103", Role.PREFILL),
        ("[::1]:8202", Role.DECODE),
    ]


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--prefiller-hosts", "a", "b", "--prefiller-ports", "1"], "--prefiller-hosts has 2"),
        (["--decoder-hosts", "0.0.0.0", "--decoder-ports", "1"], "give 127.0.0.1"),
    ],
)
def test_unpaired_or_bad_vllm_ascend_flags_say_what_is_wrong(argv: list[str], words: str) -> None:
    with pytest.raises(ValueError) as info:
        static.endpoints(_serve_args(*argv))
    assert words in str(info.value)
