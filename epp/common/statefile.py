"""``--state-file``: the instances added at runtime, kept across EPP restarts.

The file is JSON, ``{"version": 1, "instances": [{"instance": "ip:port", "type":
"decode", "engine": "vllm"}, ...]}`` (``engine`` missing: ``dataLayer.engine``; an
instance added by host name is kept as ``name:port``, so a restart looks it up again),
replaced atomically on every change (write to a temporary file, then rename), so a
crash never leaves half a file. A file that cannot be read or parsed is reported and
ignored: the EPP starts with its static endpoints rather than not at all.
"""

from __future__ import annotations

import logging
from pathlib import Path

import orjson

from epp.common.addresses import parse_address
from epp.common.readyfile import write_ready
from epp.types import Endpoint, Role

log = logging.getLogger(__name__)

VERSION = 1


def save(path: Path, endpoints: list[Endpoint]) -> None:
    doc = {
        "version": VERSION,
        "instances": [
            {"instance": e.name or e.address, "type": e.role.value, "engine": e.engine}
            for e in endpoints
        ],
    }
    try:
        write_ready(path, doc)  # the same atomic JSON write as ready files
    except OSError as exc:
        log.error("cannot write state file %s: %s", path, exc)


def load(path: Path, engine: str) -> list[Endpoint]:
    """The endpoints saved in ``path``; [] (with an error logged) if it is unusable."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    except OSError as exc:
        log.error("cannot read state file %s (%s); ignoring it", path, exc)
        return []
    try:
        return _parse(data, engine)
    except ValueError as exc:
        log.error("state file %s is corrupt (%s); ignoring it", path, exc)
        return []


def _parse(data: bytes, engine: str) -> list[Endpoint]:
    doc = orjson.loads(data)  # JSONDecodeError is a ValueError
    if not isinstance(doc, dict) or doc.get("version") != VERSION:
        raise ValueError(f"expected an object with version {VERSION}")
    items = doc.get("instances")
    if not isinstance(items, list):
        raise ValueError("'instances' is not a list")
    endpoints = []
    for item in items:  # one bad entry costs only itself
        try:
            if not isinstance(item, dict) or not isinstance(item.get("instance"), str):
                raise ValueError("not an object with an 'instance' string")
            host, port = parse_address(item["instance"])
            role = Role.parse(str(item.get("type", "decode")))
            kept = item.get("engine", engine)
            if not isinstance(kept, str) or not kept:
                raise ValueError(f"'engine' must be a non-empty string, got {kept!r}")
        except ValueError as exc:
            log.error("state file: skipping entry %r: %s", item, exc)
            continue
        endpoints.append(Endpoint(host, port, role, engine=kept))
    return endpoints
