"""The hooks' dispatch: for each hook, the tuple of the observers' methods that
implement it, built once when the lifecycle is composed. A request pays one loop per
hook over that tuple (empty when no observer wants the hook) and nothing per
observer that ignores it."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from epp.common.usage import Usage
from epp.lifecycle.hooks import EXCHANGE_HOOKS, HOOKS, Exchange, LifecycleObserver, Routing
from epp.types import Endpoint, InferenceRequest


def _implements(observer: object, hook: str) -> bool:
    """Whether ``observer`` does something on ``hook`` (not the Protocol's no-op)."""
    impl = getattr(type(observer), hook, None)
    return impl is not None and impl is not getattr(LifecycleObserver, hook)


def _hooked(observers: tuple[object, ...], hook: str) -> tuple[Callable[..., Any], ...]:
    return tuple(getattr(o, hook) for o in observers if _implements(o, hook))


class Hooks:
    """The observers, by hook. Each attribute named after a hook is the tuple of
    callables to call for it, in registration order."""

    def __init__(self, observers: Iterable[object] = ()) -> None:
        self.observers = tuple(observers)
        noting = [o for o in self.observers if getattr(o, "keeps_note", False)]
        for index, observer in enumerate(noting):
            observer.note_index = index  # type: ignore[attr-defined]
        # how many per-request notes a record carries (0: it allocates none)
        self.note_count = len(noting)
        hooked = {hook: _hooked(self.observers, hook) for hook in HOOKS}
        self.before_scheduling: tuple[Callable[[InferenceRequest], None], ...] = hooked[
            "before_scheduling"
        ]
        self.picked: tuple[Callable[[Routing], None], ...] = hooked["picked"]
        self.decode_picked: tuple[Callable[[Routing, bool | None], None], ...] = hooked[
            "decode_picked"
        ]
        self.response_headers: tuple[Callable[[str, Mapping[str, str]], None], ...] = hooked[
            "response_headers"
        ]
        self.first_byte: tuple[Callable[[Routing], None], ...] = hooked["first_byte"]
        self.response_chunk: tuple[Callable[[Routing, int], None], ...] = hooked["response_chunk"]
        self.response_complete: tuple[Callable[[Routing, int, str, Usage | None], None], ...] = (
            hooked["response_complete"]
        )
        self.ended: tuple[Callable[[Routing], None], ...] = hooked["ended"]
        self.response_status: tuple[Callable[[str, int, str], None], ...] = hooked[
            "response_status"
        ]
        self.answered: tuple[Callable[[Routing, int, str], None], ...] = hooked["answered"]
        self.rejected: tuple[Callable[[int, InferenceRequest | None], None], ...] = hooked[
            "rejected"
        ]
        self.stalled: tuple[Callable[[str, str], None], ...] = hooked["stalled"]
        self.add_headers: tuple[
            Callable[[Routing, Endpoint | None], Iterable[tuple[str, str]]], ...
        ] = hooked["add_headers"]
        self.prefill_done: tuple[Callable[[Routing, str | None, Endpoint | None], None], ...] = (
            hooked["prefill_done"]
        )
        self.started: tuple[Callable[[Exchange], None], ...] = hooked["started"]
        self.admitting: tuple[Callable[[Exchange, InferenceRequest], None], ...] = hooked[
            "admitting"
        ]
        self.held: tuple[Callable[[Exchange, InferenceRequest], None], ...] = hooked["held"]
        self.admitted: tuple[Callable[[Exchange, Routing, int], None], ...] = hooked["admitted"]
        self.closed: tuple[Callable[[Exchange, int, str], None], ...] = hooked["closed"]
        # whether a request opens an Exchange (some observer implements an exchange hook)
        self.exchanges = any(hooked[hook] for hook in EXCHANGE_HOOKS)

    def headers_for(self, routing: Routing, prefill: Endpoint | None = None) -> dict[str, str]:
        """What the ``add_headers`` observers set on the request routed by ``routing``
        (``prefill``: on its prefill leg's request), the last registered winning."""
        added: dict[str, str] = {}
        for hook in self.add_headers:
            added.update(hook(routing, prefill))
        return added

    def new_notes(self) -> list[Any]:
        """A request's note slots (the shared empty list when no observer keeps one:
        nothing writes to it then)."""
        return [None] * self.note_count if self.note_count else _NO_NOTES


_NO_NOTES: list[Any] = []
