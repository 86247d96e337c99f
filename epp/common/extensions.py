"""Registries that installed packages may extend, through Python entry points.

Four registries are open, one entry-point group each; the entry point's object is what
the registry holds (docs/extending.md shows a whole plugin package):

* ``epp.plugins``: scheduling plugin types, a :class:`epp.scheduling.registry.PluginType`;
* ``epp.coordinators``: P/D coordinators, a factory ``(CoordinatorEnv) -> Coordinator``
  (:data:`epp.disagg.coordinators.COORDINATORS`);
* ``epp.discovery``: discovery sources, an :class:`epp.serving.sources.DiscoveryKind`;
* ``epp.engines``: engine metric dialects, an
  :class:`epp.datalayer.engines.EngineMetricNames` whose ``engine`` is the name.

The entry point's *name* is the name a config or a flag uses (``type: my-scorer``,
``--coordinator my-coordinator``, ``engine: my-engine``). Entry points are listed once,
on the first use of a registry, and each object is imported on the first lookup of its
name, so an installed package costs nothing until a config names what it adds.

Built-in names are reserved: an installed entry point that reuses one is ignored (the
built-in wins) and logged as an error, once, so installing a package never changes what
an existing config means. An entry point that cannot be imported, whose object is not
what its group holds, or whose name two installed packages both claim, is an
:class:`ExtensionError` when (and only when) that name is used.
"""

from __future__ import annotations

import functools
import importlib.metadata
import logging
import re
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from epp.errors import InternalError

log = logging.getLogger(__name__)

T = TypeVar("T")

# checks a loaded object; returns it typed, or raises TypeError/ValueError saying why not
Check = Callable[[object, str], T]


class ExtensionError(InternalError, ValueError):
    """An installed entry point that cannot be used; the message names the group, the
    entry point, its package and why."""


@dataclass(frozen=True, slots=True)
class _Entry:
    name: str
    value: str  # "module:attribute"
    package: str  # "dist-name version", or "unknown package"
    load: Callable[[], object]

    def origin(self) -> str:
        return f"{self.value} from {self.package}"


@functools.cache
def _entry_points(
    path: tuple[str, ...] | None, group: str
) -> tuple[importlib.metadata.EntryPoint, ...]:
    """The entry points of ``group`` in the packages installed on ``path`` (None:
    ``sys.path``), read once per process and group. A package found twice counts once:
    the first copy, as Python imports it."""
    if path is None:
        # the standard library's listing tells packages apart by their folders' names
        # (~5 ms); reading every package's metadata for its name took ~35 ms, which each
        # `epp serve` paid (its --coordinator choices list the installed ones)
        return tuple(importlib.metadata.entry_points(group=group))
    seen: set[str] = set()
    found: list[importlib.metadata.EntryPoint] = []
    for dist in importlib.metadata.distributions(path=list(path)):
        key = re.sub(r"[-_.]+", "-", dist.metadata["Name"] or "").lower()
        if key not in seen:
            seen.add(key)
            found += dist.entry_points.select(group=group)
    return tuple(found)


def instance_of(cls: type[T]) -> Check[T]:
    """A check that the object is a ``cls``."""

    def check(obj: object, name: str) -> T:
        if not isinstance(obj, cls):
            raise TypeError(
                f"expected an instance of {cls.__module__}.{cls.__qualname__}, got {obj!r}"
            )
        return obj

    return check


class Installed(Generic[T]):
    """The entry points of one group: names listed on first use, objects loaded (and
    checked) on first lookup, each once."""

    def __init__(
        self, group: str, what: str, check: Check[T], *, path: Sequence[str] | None = None
    ) -> None:
        self.group = group
        self.what = what  # "coordinator", "plugin type", ... for messages
        self._check = check
        self._path = None if path is None else tuple(path)  # None: sys.path
        self._entries: dict[str, list[_Entry]] | None = None
        self._loaded: dict[str, T] = {}
        self._reported: set[str] = set()

    def on_path(self, path: Sequence[str]) -> Installed[T]:
        """The same group read from the packages installed in ``path`` (tests)."""
        return Installed(self.group, self.what, self._check, path=path)

    def _by_name(self) -> dict[str, list[_Entry]]:
        if self._entries is None:
            entries: dict[str, list[_Entry]] = {}
            for ep in _entry_points(self._path, self.group):
                dist = ep.dist
                package = f"{dist.name} {dist.version}" if dist is not None else "unknown package"
                entries.setdefault(ep.name, []).append(_Entry(ep.name, ep.value, package, ep.load))
            self._entries = entries
        return self._entries

    def names(self, reserved: Collection[str] = ()) -> list[str]:
        """The installed names, sorted, without those in ``reserved`` (the built-ins;
        each such clash is logged once)."""
        out = []
        for name, entries in sorted(self._by_name().items()):
            if name not in reserved:
                out.append(name)
            elif name not in self._reported:
                self._reported.add(name)
                log.error(
                    "entry point %s %r (%s) is ignored: %r is a built-in %s, and built-in "
                    "names are reserved; rename the entry point",
                    self.group,
                    name,
                    ", ".join(e.origin() for e in entries),
                    name,
                    self.what,
                )
        return out

    def load(self, name: str) -> T:
        """The object of entry point ``name`` (KeyError if there is none)."""
        if name in self._loaded:
            return self._loaded[name]
        entries = self._by_name()[name]
        if len(entries) > 1:
            raise ExtensionError(
                f"entry point {self.group} {name!r}: installed packages disagree "
                f"({'; '.join(e.origin() for e in entries)}); uninstall all but one"
            )
        entry = entries[0]
        where = f"entry point {self.group} {name!r} ({entry.origin()})"
        try:
            obj = entry.load()
        except Exception as exc:  # an import error, or any error the module raises
            raise ExtensionError(f"{where}: cannot load: {type(exc).__name__}: {exc}") from exc
        try:
            loaded = self._check(obj, name)
        except (TypeError, ValueError) as exc:
            raise ExtensionError(f"{where}: {exc}") from None
        self._loaded[name] = loaded
        return loaded


class OpenRegistry(Mapping[str, T]):
    """A read-only name -> object mapping: the built-ins, then what installed packages
    add (built-ins win). ``in`` and iteration list names without importing anything;
    looking a name up imports its entry point (ExtensionError if that fails)."""

    def __init__(self, builtins: Mapping[str, T], installed: Installed[T]) -> None:
        self._builtins = dict(builtins)
        self.installed = installed

    def on_path(self, path: Sequence[str]) -> OpenRegistry[T]:
        """The same built-ins, with what the packages installed in ``path`` add (tests)."""
        return OpenRegistry(self._builtins, self.installed.on_path(path))

    def __getitem__(self, name: str) -> T:
        if name in self._builtins:
            return self._builtins[name]
        if name in self.installed.names(self._builtins):
            return self.installed.load(name)
        raise KeyError(name)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (
            name in self._builtins or name in self.installed.names(self._builtins)
        )

    def __iter__(self) -> Iterator[str]:
        return iter([*self._builtins, *self.installed.names(self._builtins)])

    def __len__(self) -> int:
        return len(self._builtins) + len(self.installed.names(self._builtins))
