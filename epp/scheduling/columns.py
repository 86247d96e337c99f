"""Columnar views of a snapshot's endpoints, so built-in plugins score 1,000 candidates
with a few numpy operations instead of a Python loop each.

:class:`Columns` holds one array per metric field (NaN = not reported) for a tuple of
endpoint states; it is built once per snapshot (``Snapshot.derived``), since snapshots
are immutable and rebuilt when membership or metrics change. :class:`CandidateView`
maps one cycle's candidate list onto those rows and applies the cycle's staleness
bound. In-flight counts change on every request, so they are read per cycle.
"""

from __future__ import annotations

import operator
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat

import numpy as np
import numpy.typing as npt

from epp.types import EndpointState, Role, Snapshot

FloatArray = npt.NDArray[np.float64]
IndexArray = npt.NDArray[np.intp]

METRIC_FIELDS = ("waiting", "running", "kv_usage", "num_blocks", "block_size")
_ADDRESS = operator.attrgetter("address")
ROLES = tuple(Role)
# candidate tuples whose rows a snapshot remembers (a filter returning a new tuple each
# cycle must not grow a long-lived snapshot without bound)
_MAX_MEMO = 16


@dataclass(frozen=True, slots=True)
class Columns:
    """Per-field arrays over ``states`` (row i = states[i]). ``updated_at`` is -inf
    where an endpoint never reported; a metric field is NaN where it is None."""

    states: tuple[EndpointState, ...]
    updated_at: FloatArray
    fields: Mapping[str, FloatArray]
    # id(state) -> row; states are held above, so ids stay unique while this lives
    row_of_state: Mapping[int, int]
    row_of_address: Mapping[str, int]
    addresses: tuple[str, ...]
    roles: npt.NDArray[np.int8]  # ROLES.index(role) per row

    @classmethod
    def build(cls, states: tuple[EndpointState, ...]) -> Columns:
        addresses = tuple(map(_ADDRESS, states))
        metrics = [s.metrics for s in states]
        updated = [-np.inf if m is None else m.updated_at for m in metrics]
        # np.array turns None into NaN for a float dtype
        fields = {
            name: np.array([None if m is None else getattr(m, name) for m in metrics], np.float64)
            for name in METRIC_FIELDS
        }
        return cls(
            states,
            np.array(updated, np.float64),
            fields,
            dict(zip(map(id, states), range(len(states)), strict=True)),
            dict(zip(addresses, range(len(states)), strict=True)),
            addresses,
            np.array([_role_code(s) for s in states], np.int8),
        )

    def successor(self, states: tuple[EndpointState, ...]) -> Columns:
        """Columns for ``states``, copying the rows whose state object is unchanged
        from these (the datastore replaces one endpoint's state per metrics update and
        keeps the order), so a new snapshot costs O(changed rows), not O(pool)."""
        n = len(states)
        if n != len(self.states):
            return Columns.build(states)
        same = np.fromiter(map(operator.is_, states, self.states), np.bool_, n)
        changed = np.flatnonzero(~same).tolist()
        if len(changed) > n // 4 or any(
            states[i].address != self.states[i].address for i in changed
        ):
            return Columns.build(states)
        updated_at = self.updated_at.copy()
        fields = {name: column.copy() for name, column in self.fields.items()}
        row_of_state = dict(self.row_of_state)
        roles = self.roles.copy()
        for i in changed:
            roles[i] = _role_code(states[i])
            row_of_state.pop(id(self.states[i]), None)
            row_of_state[id(states[i])] = i
            m = states[i].metrics
            updated_at[i] = -np.inf if m is None else m.updated_at
            for name, column in fields.items():
                value = None if m is None else getattr(m, name)
                column[i] = np.nan if value is None else value
        return Columns(
            states, updated_at, fields, row_of_state, self.row_of_address, self.addresses, roles
        )

    def with_role(self, roles: Iterable[Role]) -> npt.NDArray[np.bool_]:
        """True where the endpoint's role is one of ``roles``."""
        return np.isin(self.roles, [ROLES.index(r) for r in roles])


def _role_code(state: EndpointState) -> int:
    return ROLES.index(state.endpoint.role)


# The columns built last per pool (keyed by the datastore's live address index, which
# all of a pool's snapshots share): the next snapshot of that pool (usually one
# endpoint's metrics replaced) starts from them. Only ever a shortcut: rows are reused
# for the very same (immutable) state objects. A few pools at most (benchmarks, tests).
_LAST_POOLS = 4
_last: OrderedDict[int, tuple[object, Columns]] = OrderedDict()


def snapshot_columns(snapshot: Snapshot) -> Columns:
    """The snapshot's columns, built on first use and kept with the snapshot."""
    cols = snapshot.derived.get("columns")
    if cols is None:
        states = snapshot.endpoints
        key = id(snapshot.by_address)  # held below, so the id is not reused meanwhile
        last = _last.get(key)
        cols = last[1].successor(states) if last else Columns.build(states)
        snapshot.derived["columns"] = cols
        _last[key] = (snapshot.by_address, cols)
        _last.move_to_end(key)
        if len(_last) > _LAST_POOLS:
            _last.popitem(last=False)
    result: Columns = cols
    return result


@dataclass(slots=True)
class CandidateView:
    """One candidate list of one cycle as rows of a :class:`Columns`."""

    candidates: Sequence[EndpointState]
    columns: Columns
    rows: IndexArray
    stale_before: float  # metrics updated before this count as unknown
    addresses: tuple[str, ...]
    _fresh: npt.NDArray[np.bool_] | None = None
    _values: dict[str, FloatArray] = field(default_factory=dict)

    def fresh(self) -> npt.NDArray[np.bool_]:
        """True where the candidate's metrics are reported and not stale."""
        if self._fresh is None:
            self._fresh = self.columns.updated_at[self.rows] >= self.stale_before
        return self._fresh

    def metric(self, name: str) -> FloatArray:
        """The field (``waiting``, ``running``, ``kv_usage``) per candidate; NaN where
        unknown or stale. Read-only: shared by every scorer of the cycle."""
        values = self._values.get(name)
        if values is None:
            values = np.where(self.fresh(), self.columns.fields[name][self.rows], np.nan)
            values.flags.writeable = False
            self._values[name] = values
        return values

    def counts(self, table: Mapping[str, int]) -> FloatArray:
        """``table[address]`` (0 if absent) per candidate, e.g. the in-flight counts
        (read once per cycle: the live tables cannot change during one). Read-only."""
        key = f"counts/{id(table)}"
        cached = self._values.get(key)
        if cached is None:
            cached = self._values[key] = self._read_counts(table)
            cached.flags.writeable = False
        return cached

    def _read_counts(self, table: Mapping[str, int]) -> FloatArray:
        n = len(self.addresses)
        try:  # the datastore keeps a count for every member: one C-level lookup pass
            found = operator.itemgetter(*self.addresses)(table) if n else ()
            values = (found,) if n == 1 else found
        except KeyError:
            values = map(table.get, self.addresses, repeat(0))
        # counts are ints: reading them as ints first is a third faster than as floats
        return np.fromiter(values, np.int64, n).astype(np.float64)

    def by_address(self, values: Mapping[str, float], default: float = 0.0) -> FloatArray:
        """``values[address]`` (``default`` if absent) per candidate, for a mapping that
        names few addresses (e.g. the prefix matches): cost O(len(values))."""
        cols = self.columns
        if len(cols.row_of_address) != len(cols.addresses):  # an address repeats (never
            # from the datastore): every row with it gets its value, as on the list path
            return np.fromiter(
                map(values.get, self.addresses, repeat(default)), np.float64, len(self.addresses)
            )
        missing = len(cols.states)  # one extra slot for addresses not in the columns
        rows = np.fromiter(
            map(cols.row_of_address.get, values, repeat(missing)), np.intp, len(values)
        )
        by_row = np.full(missing + 1, default)
        by_row[rows] = np.fromiter(values.values(), np.float64, len(values))
        result: FloatArray = by_row[self.rows]
        return result


def select(snapshot: Snapshot, mask: npt.NDArray[np.bool_]) -> tuple[EndpointState, ...]:
    """The snapshot's endpoints where ``mask`` (over its columns' rows) is True, as a
    tuple whose rows candidate views then know without a lookup (all: the endpoints)."""
    endpoints = snapshot.endpoints
    if mask.all():
        return endpoints
    rows = np.flatnonzero(mask)
    kept = tuple(map(endpoints.__getitem__, rows.tolist()))
    memo = snapshot.derived.setdefault("rows", {})
    if len(memo) < _MAX_MEMO:
        cols = snapshot_columns(snapshot)
        memo[id(kept)] = (kept, cols, rows, tuple(map(cols.addresses.__getitem__, rows.tolist())))
    return kept


def candidate_view(
    snapshot: Snapshot, candidates: Sequence[EndpointState], stale_before: float
) -> CandidateView:
    """Map ``candidates`` onto the snapshot's columns (candidates not in the snapshot
    get columns of their own). A tuple's rows are kept with the snapshot (tuples are
    immutable), so a filter that returns the same tuple every cycle pays once."""
    memo = snapshot.derived.setdefault("rows", {})
    cached = memo.get(id(candidates))
    if cached is not None and cached[0] is candidates:
        cols, rows, addresses = cached[1], cached[2], cached[3]
    else:
        cols = snapshot_columns(snapshot)
        n = len(candidates)
        addresses = cols.addresses
        if candidates is snapshot.endpoints:
            rows = np.arange(n)
        else:
            try:
                rows = np.fromiter(
                    map(cols.row_of_state.__getitem__, map(id, candidates)), np.intp, n
                )
            except KeyError:  # not the snapshot's states (a test, a third-party filter)
                cols = Columns.build(tuple(candidates))
                rows = np.arange(n)
            addresses = tuple(map(_ADDRESS, candidates))
        if isinstance(candidates, tuple) and len(memo) < _MAX_MEMO:
            memo[id(candidates)] = (candidates, cols, rows, addresses)
    return CandidateView(candidates, cols, rows, stale_before, addresses)
