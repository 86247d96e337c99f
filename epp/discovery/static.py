"""``epp serve`` flags naming the model servers at start.

Two spellings, both from the seeds' launch lines:

* ``--decode``, ``--prefill``, ``--prefill-decode``, ``--endpoint``: each takes one or
  more ``host:port`` (``--prefill localhost:8100 localhost:8101``) and may be repeated;
* the vllm-ascend load-balance proxy's ``--prefiller-hosts H.. --prefiller-ports P..``
  and ``--decoder-hosts H.. --decoder-ports P..``: the i-th host with the i-th port.

:class:`StaticSource` adds them (and the config file's ``endpoints``) when the EPP starts;
a server given by name is resolved and followed by :mod:`epp.discovery.names`.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from epp.common import argtypes
from epp.common.addresses import join, parse_address
from epp.discovery.names import NameResolver
from epp.types import Endpoint, Role

_SERVER_FLAGS = (
    ("--endpoint", Role.DECODE, "model servers to route to (role decode)"),
    ("--decode", Role.DECODE, "decode servers"),
    ("--prefill", Role.PREFILL, "prefill servers"),
    ("--prefill-decode", Role.BOTH, "servers that do both"),
)
_PAIRED = (("prefiller", Role.PREFILL), ("decoder", Role.DECODE))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    for flag, role, what in _SERVER_FLAGS:
        parser.add_argument(
            flag,
            action="extend",
            nargs="+",
            dest="endpoints",
            type=argtypes.endpoint(role),
            default=[],
            metavar="HOST:PORT",
            help=f"{what}: one or more (repeatable); HOST an IP or a name",
        )
    g = parser.add_argument_group(
        "the vllm-ascend proxy's spelling (the i-th host goes with the i-th port)"
    )
    for kind, role in _PAIRED:
        g.add_argument(
            f"--{kind}-hosts", nargs="+", default=[], metavar="HOST", help=f"{role.value} hosts"
        )
        g.add_argument(
            f"--{kind}-ports",
            nargs="+",
            type=argtypes.port,
            default=[],
            metavar="PORT",
            help=f"their ports, one per --{kind}-hosts value",
        )


def endpoints(args: argparse.Namespace) -> list[Endpoint]:
    """Every server the flags name, in flag order; ValueError says which flag is wrong."""
    out: list[Endpoint] = list(args.endpoints)
    for kind, role in _PAIRED:
        out += paired(kind, getattr(args, f"{kind}_hosts"), getattr(args, f"{kind}_ports"), role)
    return out


def paired(kind: str, hosts: list[str], ports: list[int], role: Role) -> list[Endpoint]:
    if len(hosts) != len(ports):
        raise ValueError(
            f"--{kind}-hosts has {len(hosts)} value(s) and --{kind}-ports {len(ports)}: "
            "give one port per host"
        )
    out = []
    for host, port in zip(hosts, ports, strict=True):
        text = join(host.strip("[]"), port)
        try:
            out.append(Endpoint(*parse_address(text), role))
        except ValueError as exc:
            raise ValueError(f"--{kind}-hosts/--{kind}-ports: {exc}") from None
    return out


class StaticSource:
    """The discovery source of endpoints named at start (flags, config file)."""

    def __init__(self, endpoints: Sequence[Endpoint], names: NameResolver) -> None:
        self.endpoints = tuple(endpoints)
        self._names = names

    async def start(self) -> None:
        for endpoint in self.endpoints:
            await self._names.add_static(endpoint)

    async def stop(self) -> None:
        """Nothing to stop: the endpoints stay (the process is ending)."""
