"""Model-server addresses as users write them: ``ip:port``, ``[v6]:port`` or
``name:port`` (pure: no lookups here; :mod:`epp.discovery.names` resolves names).

One server must be one member, and Envoy must never be sent an address it rejects, so
every entry point (flags, config, admin API, state file) reads addresses through
:func:`parse_address`:

* IP literals are canonical (``::1``, not ``0:0::1``; ``::ffff:10.0.0.1`` is
  ``10.0.0.1``), the spelling Envoy uses when it reports which upstream answered;
* host names are lower-cased and checked (RFC 1123 labels), then resolved at the edge;
* ``0.0.0.0`` and ``::`` are refused: they mean "any address" to a server binding a
  socket, not a place Envoy can connect to.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable

from epp.types import parse_host_port

_LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")


def parse_address(text: str) -> tuple[str, int]:
    """``(host, port)`` with ``host`` a canonical IP or a lower-case host name; raises
    ValueError saying precisely what is wrong."""
    host, port = parse_host_port(text)
    return canonical_host(host, text), port


def canonical_host(host: str, given: str | None = None) -> str:
    """The canonical IP literal, or the checked lower-case name (``given``: the text
    to quote in errors)."""
    quoted = repr(given if given is not None else host)
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        name = host.lower().removesuffix(".")
        if len(name) > 253 or not all(_LABEL.match(label) for label in name.split(".")):
            raise ValueError(
                f"malformed address {quoted}: {host!r} is neither an IP address nor a host name"
            ) from None
        return name
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_unspecified:
        raise ValueError(
            f"address {quoted}: {ip} means 'any address' to a server listening on it, not "
            "an address to connect to; give 127.0.0.1 (a server on Envoy's host) or the "
            "server's own address"
        )
    return ip.compressed


def is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def join(host: str, port: int) -> str:
    """``host:port``, IPv6 hosts bracketed."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def pick(results: Iterable[tuple[int, str]]) -> str | None:
    """The one address a name stands for, from ``(family, ip)`` lookup results in the
    resolver's order: the first IPv4 one, else the first IPv6 one (``localhost`` is
    ``127.0.0.1`` and ``::1``; servers that listen on 127.0.0.1 only are the common
    case). Unusable results (unspecified addresses) are skipped; None if none is left."""
    usable = []
    for family, ip in results:
        try:
            usable.append((family, canonical_host(ip.partition("%")[0])))
        except ValueError:
            continue
    for _family, ip in usable:
        if ipaddress.ip_address(ip).version == 4:
            return ip
    return usable[0][1] if usable else None
