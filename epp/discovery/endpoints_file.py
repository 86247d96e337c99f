"""The ``--endpoints-file`` format: the llm-d Router's ``file-discovery`` file.

YAML, or JSON (a document starting with ``{``)::

    endpoints:
      - name: vllm-0            # optional here; unique within the file when given
        namespace: default      # accepted, not used
        address: 10.0.0.1       # an IP address (v4 or v6): names are not resolved
        port: "8000"            # 1-65535, a string (as llm-d writes it) or a number
        labels:                 # optional
          llm-d.ai/role: prefill  # prefill, decode, prefill-decode (or both); default decode
          inference.networking.k8s.io/engine-type: vllm  # default: dataLayer.engine

The role and engine labels mean what they mean on a Kubernetes pod
(:mod:`epp.discovery.pool_endpoints`). Unlike llm-d, which skips a bad entry, any
problem rejects the whole file: a typo must not drain a server. Every problem names the
line (YAML) or the entry (JSON) and what is wrong. Pure: text in, endpoints out.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from epp.common.addresses import canonical_host, is_ip
from epp.common.lazymodule import lazy_module
from epp.datalayer.engines import ENGINES
from epp.discovery.pool_endpoints import ENGINE_KEY, ROLE_LABEL
from epp.errors import InternalError
from epp.types import Endpoint, Role

if TYPE_CHECKING:
    import yaml
else:  # only with --endpoints-file
    yaml = lazy_module("yaml")

MAX_BYTES = 1 << 20  # llm-d's limit too
_FIELDS = {"name", "namespace", "address", "port", "labels"}


class EndpointsFileError(InternalError, ValueError):
    """The file cannot be used; the message names the place and the problem."""


def parse(text: str, source: str, engine: str = "vllm") -> tuple[Endpoint, ...]:
    """The endpoints ``text`` lists (``source``: the path, for messages); raises
    EndpointsFileError."""
    if len(text.encode()) > MAX_BYTES:
        raise EndpointsFileError(f"{source}: larger than {MAX_BYTES} bytes")
    doc, lines = _load(text, source)
    if doc is None:
        raise EndpointsFileError(f"{source}: empty; expected 'endpoints:' with a list")
    if not isinstance(doc, Mapping):
        raise EndpointsFileError(f"{source}: expected a mapping with 'endpoints', got {doc!r}")
    extra = sorted(str(k) for k in doc if k != "endpoints")
    if extra:
        raise EndpointsFileError(f"{source}: unknown key(s) {extra}; only 'endpoints'")
    items = doc.get("endpoints")
    if items is None:  # `endpoints:` alone: none
        items = []
    if not isinstance(items, list):
        raise EndpointsFileError(f"{source}: 'endpoints' must be a list, got {items!r}")
    out: dict[str, Endpoint] = {}
    names: dict[str, str] = {}
    for i, item in enumerate(items):
        where = f"{source}: {_at(lines, i)}endpoints[{i}]"
        endpoint, name = _entry(item, where, engine)
        if endpoint.address in out:
            raise EndpointsFileError(f"{where}: {endpoint.address} is listed twice")
        if name is not None:
            if name in names:
                raise EndpointsFileError(f"{where}: name {name!r} is also {names[name]}'s")
            names[name] = endpoint.address
        out[endpoint.address] = endpoint
    return tuple(out.values())


def _at(lines: list[int], i: int) -> str:
    return f"line {lines[i]}: " if i < len(lines) else ""


def _load(text: str, source: str) -> tuple[Any, list[int]]:
    """The document, and the line of each ``endpoints`` entry (YAML only)."""
    if text.lstrip().startswith("{"):  # JSON, which may be indented with tabs
        try:
            return json.loads(text), []
        except json.JSONDecodeError as exc:
            raise EndpointsFileError(
                f"{source}: line {exc.lineno}, column {exc.colno}: invalid JSON: {exc.msg}"
            ) from None
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        doc = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise EndpointsFileError(f"{source}: {where}invalid YAML: {exc.problem}") from None
    except yaml.YAMLError as exc:
        raise EndpointsFileError(f"{source}: invalid YAML: {exc}") from None
    finally:
        loader.dispose()
    return doc, _entry_lines(node)


def _entry_lines(node: yaml.Node | None) -> list[int]:
    if not isinstance(node, yaml.MappingNode):
        return []
    for key, value in node.value:
        if key.value == "endpoints" and isinstance(value, yaml.SequenceNode):
            return [item.start_mark.line + 1 for item in value.value]
    return []


def _entry(item: Any, where: str, engine: str) -> tuple[Endpoint, str | None]:
    if not isinstance(item, Mapping):
        raise EndpointsFileError(f"{where}: expected a mapping, got {item!r}")
    extra = sorted(str(k) for k in item if k not in _FIELDS)
    if extra:
        raise EndpointsFileError(f"{where}: unknown key(s) {extra}; known: {sorted(_FIELDS)}")
    name = item.get("name")
    if name is not None and (not isinstance(name, str) or not name):
        raise EndpointsFileError(f"{where}.name: must be a non-empty string, got {name!r}")
    address = item.get("address")
    if not isinstance(address, str) or not is_ip(address.strip("[]")):
        raise EndpointsFileError(
            f"{where}.address: must be an IP address (names are not resolved here), got {address!r}"
        )
    host = canonical_host(address.strip("[]"))
    labels = item.get("labels") or {}
    if not isinstance(labels, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
    ):
        raise EndpointsFileError(f"{where}.labels: must map strings to strings, got {labels!r}")
    try:
        role = Role.parse(labels.get(ROLE_LABEL, Role.DECODE.value))
    except ValueError as exc:
        raise EndpointsFileError(f"{where}.labels.{ROLE_LABEL}: {exc}") from None
    kind = labels.get(ENGINE_KEY, engine)
    if kind not in ENGINES:
        known = ", ".join(sorted(ENGINES))
        raise EndpointsFileError(f"{where}.labels.{ENGINE_KEY}: {kind!r} is not one of {known}")
    return Endpoint(host, _port(item.get("port"), where), role, dict(labels), kind), name


def _port(value: Any, where: str) -> int:
    text = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
    if not isinstance(text, str) or not text.isdigit() or not 1 <= int(text) <= 65535:
        raise EndpointsFileError(f"{where}.port: must be a port 1-65535, got {value!r}")
    return int(text)
