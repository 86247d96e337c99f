"""Typed access to a plugin's ``parameters`` with errors that name the key."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, TypeVar

from epp.errors import InternalError

T = TypeVar("T")


class ConfigError(InternalError, ValueError):
    """A config problem; the message names where (file, key) and why."""


class Params:
    """Reads a plugin's parameters; :meth:`done` rejects keys nobody asked for, so a
    typo is an error instead of a silently ignored setting. :attr:`resolved` keeps what
    each read returned (the default where the key was absent), for the effective config."""

    def __init__(self, where: str, raw: Mapping[str, Any] | None) -> None:
        if raw is not None and not isinstance(raw, Mapping):
            raise ConfigError(f"{where}: 'parameters' must be a mapping, got {raw!r}")
        self.where = where
        self._raw = dict(raw or {})
        self._used: set[str] = set()
        self.resolved: dict[str, Any] = {}

    def get(self, key: str) -> Any:
        """The raw value (None when absent), for checks the typed readers lack."""
        self._used.add(key)
        value = self._raw.get(key)
        self.resolved[key] = value
        return value

    def _keep(self, key: str, value: T) -> T:
        self.resolved[key] = value
        return value

    def number(
        self,
        key: str,
        default: float,
        *,
        minimum: float | None = None,
        maximum: float | None = None,
    ) -> float:
        value = self.get(key)
        if value is None:
            return self._keep(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{self.where}.{key}: expected a number, got {value!r}")
        if not math.isfinite(value):
            raise ConfigError(f"{self.where}.{key}: must be a finite number, got {value!r}")
        self._check_range(key, value, minimum, maximum)
        return self._keep(key, float(value))

    def integer(
        self, key: str, default: int, *, minimum: int | None = None, maximum: int | None = None
    ) -> int:
        value = self.get(key)
        if value is None:
            return self._keep(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{self.where}.{key}: expected an integer, got {value!r}")
        self._check_range(key, value, minimum, maximum)
        return self._keep(key, value)

    def optional_integer(
        self, key: str, default: int | None, *, minimum: int, maximum: int | None = None
    ) -> int | None:
        """An integer in range, or null (None) where null has a meaning of its own."""
        value = self.get(key)
        if value is None:
            return self._keep(key, default)
        bounds = f">= {minimum}" if maximum is None else f"from {minimum} to {maximum}"
        if (
            isinstance(value, bool)
            or not isinstance(value, int)
            or value < minimum
            or (maximum is not None and value > maximum)
        ):
            raise ConfigError(f"{self.where}.{key}: an integer {bounds}, or null; got {value!r}")
        return self._keep(key, value)

    def _check_range(
        self, key: str, value: float, minimum: float | None, maximum: float | None
    ) -> None:
        if minimum is not None and value < minimum:
            raise ConfigError(f"{self.where}.{key}: must be >= {minimum}, got {value}")
        if maximum is not None and value > maximum:
            raise ConfigError(f"{self.where}.{key}: must be <= {maximum}, got {value}")

    def boolean(self, key: str, default: bool) -> bool:
        value = self.get(key)
        if value is None:
            return self._keep(key, default)
        if not isinstance(value, bool):
            raise ConfigError(f"{self.where}.{key}: expected true or false, got {value!r}")
        return self._keep(key, value)

    def string(self, key: str, default: str, *, choices: tuple[str, ...] = ()) -> str:
        value = self.get(key)
        if value is None:
            return self._keep(key, default)
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{self.where}.{key}: expected a non-empty string, got {value!r}")
        if choices and value not in choices:
            raise ConfigError(f"{self.where}.{key}: must be one of {list(choices)}, got {value!r}")
        return self._keep(key, value)

    def strings(self, key: str, default: tuple[str, ...]) -> tuple[str, ...]:
        value = self.get(key)
        if value is None:
            return self._keep(key, default)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{self.where}.{key}: expected a list of strings, got {value!r}")
        return self._keep(key, tuple(value))

    def mapping(self, key: str) -> dict[str, str]:
        value = self.get(key)
        if value is None:
            return self._keep(key, {})
        if not isinstance(value, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        ):
            raise ConfigError(f"{self.where}.{key}: expected a string->string map, got {value!r}")
        return self._keep(key, dict(value))

    def done(self) -> None:
        unknown = sorted(set(self._raw) - self._used)
        if unknown:
            known = sorted(self._used)
            raise ConfigError(
                f"{self.where}: unknown parameter(s) {unknown}; known: {known or 'none'}"
            )
