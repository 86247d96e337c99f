"""What a source must change in the pool when its list of endpoints changes: a pure
function of the list it applied last and the new one (both keyed by address).

Sources that own a whole list (the InferencePool's pods, the ``--endpoints-file``)
:func:`apply` it the same way: :meth:`~epp.datastore.Datastore.remove` for ``removed``
(the drain the admin API's remove uses: requests in flight finish), then
:meth:`~epp.datastore.Datastore.add` for ``added`` and ``changed``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from epp.datastore import Datastore
from epp.types import Endpoint


@dataclass(frozen=True, slots=True)
class MembershipDiff:
    added: tuple[Endpoint, ...] = ()  # new addresses
    changed: tuple[Endpoint, ...] = ()  # same address, other role, labels or engine
    removed: tuple[str, ...] = ()  # addresses no longer listed

    def __bool__(self) -> bool:
        return bool(self.added or self.changed or self.removed)

    def summary(self) -> str:
        """``2 added (a, b), 1 changed (c: prefill -> decode), 1 removed (d)``."""
        parts = []
        if self.added:
            parts.append(f"{len(self.added)} added ({', '.join(e.address for e in self.added)})")
        if self.changed:
            parts.append(
                f"{len(self.changed)} changed ({', '.join(_role(e) for e in self.changed)})"
            )
        if self.removed:
            parts.append(f"{len(self.removed)} removed ({', '.join(self.removed)})")
        return ", ".join(parts) or "no change"


def _role(endpoint: Endpoint) -> str:
    return f"{endpoint.address} now {endpoint.role.value}"


def diff(old: Mapping[str, Endpoint], new: Mapping[str, Endpoint]) -> MembershipDiff:
    """Going from ``old`` to ``new`` (address -> endpoint), in ``new``'s order."""
    return MembershipDiff(
        added=tuple(e for a, e in new.items() if a not in old),
        changed=tuple(e for a, e in new.items() if a in old and old[a] != e),
        removed=tuple(a for a in old if a not in new),
    )


def apply(datastore: Datastore, change: MembershipDiff) -> None:
    """Removals first (they drain), then additions and changes."""
    for address in change.removed:
        datastore.remove(address)
    for endpoint in (*change.added, *change.changed):
        datastore.add(endpoint)
