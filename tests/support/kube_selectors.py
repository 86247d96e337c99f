"""Label and field selectors and query booleans, read the way the API server reads them
(for the fake API server in tests/support/fake_kube.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Obj = dict[str, Any]


def parse_bool(text: str) -> bool:
    """Query booleans as the API server reads them (Go's strconv.ParseBool); the Python
    client sends ``True``."""
    return text in ("1", "t", "T", "TRUE", "true", "True")


class SelectorError(ValueError):
    pass


def matcher(query: Any) -> Callable[[Obj], bool]:
    labels = _requirements(query.get("labelSelector", ""), "label")
    fields = _requirements(query.get("fieldSelector", ""), "field")
    for name, _, _ in fields:
        if name not in ("metadata.name", "metadata.namespace"):
            raise SelectorError(f'field label not supported: "{name}"')

    def matches(obj: Obj) -> bool:
        meta = obj.get("metadata", {})
        have = meta.get("labels") or {}
        got = {"metadata.name": meta.get("name"), "metadata.namespace": meta.get("namespace")}
        return all((have.get(k) == v) == eq for k, eq, v in labels) and all(
            (got[k] == v) == eq for k, eq, v in fields
        )

    return matches


def _requirements(text: str, what: str) -> list[tuple[str, bool, str]]:
    out = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        for op, eq in (("!=", False), ("==", True), ("=", True)):
            key, sep, value = part.partition(op)
            if sep:
                out.append((key.strip(), eq, value.strip()))
                break
        else:
            raise SelectorError(f"unsupported {what} selector requirement {part!r}")
    return out
