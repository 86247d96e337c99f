"""Config sections declared once: a frozen dataclass per section (beside the component
that uses it), whose fields carry their YAML key, a one-line doc and their bounds.

From that one declaration come the defaults (the dataclass's own), the reader
(:func:`read_section`: typed, every error names the key) and the commented YAML that
the built-in default config and its documentation are generated from
(:func:`render_section`). Field types understood: ``bool``, ``int``, ``float``,
``str`` (optionally one of ``choices``), ``int | None`` (null has a meaning),
``tuple[str, ...]``, ``Mapping[str, str]``, ``Mapping[str, int]``, ``Mapping[str,
Mapping[str, int]]`` (weights) and a nested section (:func:`section_key`).
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from epp.common.lazymodule import lazy_module
from epp.common.params import ConfigError, Params

if TYPE_CHECKING:
    import yaml
else:  # only to render a config as text
    yaml = lazy_module("yaml")

T = TypeVar("T")
_META = "epp.setting"


@dataclasses.dataclass(frozen=True)
class Setting:
    key: str  # the YAML key
    doc: str  # one line: the comment above the key in the generated YAML
    minimum: float | None = None
    maximum: float | None = None
    # allowed strings; a registry's live keys view keeps up with later registrations
    choices: Collection[str] = ()


def setting(
    default: T,
    key: str,
    doc: str,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    choices: Collection[str] = (),
) -> T:
    """A field of a section: its default (written here only), YAML key and doc line."""
    meta = Setting(key, doc, minimum, maximum, choices)
    return dataclasses.field(default=default, metadata={_META: meta})


def setting_factory(factory: Callable[[], T], key: str, doc: str) -> T:
    """:func:`setting` for a mutable default (a mapping), made fresh per instance."""
    return dataclasses.field(default_factory=factory, metadata={_META: Setting(key, doc)})


def section_key(key: str) -> dict[str, Setting]:
    """The ``metadata`` of a nested section's field (``field(default_factory=Cls,
    metadata=section_key("yamlKey"))``); its doc line is the class docstring's first."""
    return {_META: Setting(key, "")}


def declared(cls: type) -> Iterator[tuple[dataclasses.Field[Any], Setting, Any]]:
    """(field, its setting, its resolved type) for each field declared with
    :func:`setting`, :func:`setting_factory` or :func:`section_key`, in order."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        meta = f.metadata.get(_META)
        if isinstance(meta, Setting):
            hint = hints[f.name]
            if not meta.doc:  # a section: its class's docstring says what it is
                doc = (hint.__doc__ or "").strip().splitlines()
                meta = dataclasses.replace(meta, doc=" ".join(doc[:1]))
            yield f, meta, hint


def read_section(cls: type[T], raw: Any, where: str) -> T:
    """The section ``cls`` from its YAML mapping (None: all defaults)."""
    if raw is not None and not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: expected a mapping, got {raw!r}")
    p = Params(where, raw)
    default = cls()
    values = {f.name: _read(p, s, hint, getattr(default, f.name)) for f, s, hint in declared(cls)}
    p.done()
    return cls(**values)


def _read(p: Params, s: Setting, hint: Any, default: Any) -> Any:
    lo, hi = s.minimum, s.maximum
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return read_section(hint, p.get(s.key), f"{p.where}.{s.key}")
    if hint is bool:
        return p.boolean(s.key, default)
    if hint is int:
        return p.integer(s.key, default, minimum=_int(lo), maximum=_int(hi))
    if hint is float:
        return p.number(s.key, default, minimum=lo, maximum=hi)
    if hint is str:
        return p.string(s.key, default, choices=tuple(s.choices))
    if hint == int | None:
        return p.optional_integer(s.key, default, minimum=_int(lo) or 0, maximum=_int(hi))
    if hint == tuple[str, ...]:
        return p.strings(s.key, default)
    if hint == Mapping[str, str]:
        return p.mapping(s.key) if p.get(s.key) is not None else default
    if hint == Mapping[str, Mapping[str, int]]:
        return _weights(p, s.key, default)
    if typing.get_origin(hint) is Mapping and typing.get_args(hint) == (str, int):
        value = p.get(s.key)
        if value is None:
            return default
        if not isinstance(value, Mapping) or not all(
            isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool)
            for k, v in value.items()
        ):
            raise ConfigError(f"{p.where}.{s.key}: expected name -> integer, got {value!r}")
        return dict(value)
    raise TypeError(f"setting {s.key!r}: unsupported type {hint!r}")


def _weights(p: Params, key: str, default: Any) -> Any:
    """``name -> {target: weight}``: each target map non-empty, weights >= 0, one > 0."""
    value = p.get(key)
    if value is None:
        return default
    where = f"{p.where}.{key}"
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: expected name -> {{target: weight}}, got {value!r}")
    out = {}
    for name, targets in value.items():
        ok = isinstance(name, str) and name and isinstance(targets, Mapping) and targets
        if not ok or not all(
            isinstance(t, str) and t and isinstance(w, int) and not isinstance(w, bool) and w >= 0
            for t, w in targets.items()
        ):
            raise ConfigError(
                f"{where}.{name}: expected a non-empty map of target name -> integer weight "
                f">= 0, got {targets!r}"
            )
        if not any(targets.values()):
            raise ConfigError(f"{where}.{name}: at least one weight must be above 0")
        out[name] = dict(targets)
    return out


def _int(bound: float | None) -> int | None:
    return None if bound is None else int(bound)


def render_section(obj: Any, indent: int = 0) -> list[str]:
    """``obj``'s settings as YAML lines, each under a comment with its doc line."""
    pad = " " * indent
    lines = []
    for f, s, _hint in declared(type(obj)):
        value = getattr(obj, f.name)
        choices = f" (one of: {', '.join(s.choices)})" if s.choices else ""
        lines.append(f"{pad}# {s.doc}{choices}")
        if dataclasses.is_dataclass(value):
            lines.append(f"{pad}{s.key}:")
            lines += render_section(value, indent + 2)
        else:
            lines.append(f"{pad}{s.key}: {yaml_value(value)}")
    return lines


def yaml_value(value: Any) -> str:
    """One value as inline YAML."""
    text = yaml.safe_dump(
        plain_data(value), default_flow_style=True, width=1 << 20, sort_keys=False
    )
    return text.rstrip("\n").removesuffix("\n...")


def plain_data(value: Any) -> Any:
    """``value`` as plain YAML data: tuples as lists, mappings as dicts, whole floats
    without ``.0`` (``5``, not ``5.0``: they read back the same)."""
    if isinstance(value, Mapping):
        return {k: plain_data(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [plain_data(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value
