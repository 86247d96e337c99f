"""A module imported on its first use, for optional dependencies of a part that most
processes build but few start (ZeroMQ for KV events and peer load): every ``epp``
process would pay for the import at start-up otherwise (docs/testing.md, "Cheap process
start"). Write the real import under ``TYPE_CHECKING`` for the type checker::

    if TYPE_CHECKING:
        import zmq
        import zmq.asyncio
    else:
        zmq = lazy_module("zmq", "zmq.asyncio")
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any


class _LazyModule(ModuleType):
    def __init__(self, name: str, submodules: tuple[str, ...]) -> None:
        super().__init__(name)
        self._lazy_submodules = submodules

    def __getattr__(self, attr: str) -> Any:
        # called only for what __dict__ lacks: the first use, then nothing it copied
        module = importlib.import_module(self.__name__)
        for name in self._lazy_submodules:
            importlib.import_module(name)
        self.__dict__.update(vars(module))
        return getattr(module, attr)


def lazy_module(name: str, *submodules: str) -> ModuleType:
    """Module ``name``, imported (with ``submodules``, which its attributes then reach)
    when an attribute is first read. An import error surfaces there, not here."""
    return _LazyModule(name, submodules)
