"""The ledger's snapshot as columns: one flat list per field instead of one row per unit or lease.

A run of 100,000 units leaves a ledger of 100,000 units and as many leases or more, and the
coordinator captures it between two merges, every ``snapshot_every`` results. As rows (format 1)
that capture took ~1 s on the event loop at 200,000 leases, and packing it ~6 s more, because
every row is a list and every field a node to walk. As columns the structure is a few dozen flat
lists of plain values, which the wire packs and unpacks without a Python step per value.

Two parts of it are kept up to date as the ledger changes, so a capture copies them instead of
rebuilding them: the units' specs (units are only ever added) and the leases that are over
(:class:`LeaseArchive`: closed or superseded leases never change again). Only the units' states
and the leases still open are read afresh.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from operator import attrgetter
from typing import Any

from ..errors import ConfigError
from ._types import LeaseRecord, LeaseState, UnitRecord, UnitState, WorkerRecord
from ._units import Receipt, WorkUnit, receipt_status

__all__ = ["LEASE_FIELDS", "WORKER_FIELDS", "LeaseArchive", "UnitSpecs", "UnitStates",
           "lease_records", "restore_unit_states", "unit_specs", "worker_flag", "worker_table",
           "worker_table_rows"]

#: Snapshot columns of a unit's spec (its ``params`` are kept sparse: most units have none).
SPEC_FIELDS = ("unit_id", "shard", "num_shards", "epoch", "steps")
#: Snapshot columns of a unit's state (``failed_by`` is kept sparse).
STATE_FIELDS = ("state", "attempts", "issued", "lease_id", "reason", "done_by", "last_failure")
#: Snapshot columns of a lease. ``remaining`` is the deadline less the capture's time for an active
#: lease (0 for the others: no deadline applies to them); the receipt's lease and unit are the
#: lease's own.
LEASE_FIELDS = ("lease_id", "unit_id", "worker_id", "base_version", "remaining", "steps_done",
                "state", "receipt_status", "receipt_version", "receipt_reason")

# states as their plain strings (``_value_``): an enum member is not a str to the packer's fast path
_STATE_GETTERS = {name: attrgetter("state._value_" if name == "state" else name)
                  for name in STATE_FIELDS}
_UNIT_STATES = {s.value: s for s in UnitState}
_LEASE_STATES = {s.value: s for s in LeaseState}


class UnitSpecs:
    """The specs of every unit, as columns, in unit order (units are only ever appended)."""

    def __init__(self) -> None:
        self._cols: dict[str, list[Any]] = {name: [] for name in SPEC_FIELDS}
        self._params: tuple[list[int], list[dict[str, Any]]] = ([], [])

    def append(self, index: int, unit: WorkUnit) -> None:
        c = self._cols
        c["unit_id"].append(unit.unit_id)
        c["shard"].append(unit.shard)
        c["num_shards"].append(unit.num_shards)
        c["epoch"].append(unit.epoch)
        c["steps"].append(unit.steps)
        if unit.params:
            self._params[0].append(index)
            self._params[1].append(dict(unit.params))

    def table(self) -> dict[str, Any]:
        """A copy (packed later, in another thread, while units may still be added)."""
        out: dict[str, Any] = {name: list(col) for name, col in self._cols.items()}
        out["params"] = [list(self._params[0]), list(self._params[1])]
        return out


class UnitStates:
    """The units' states as columns, kept from one capture to the next: a capture reads again only
    the units the ledger changed since (:meth:`touch`) and those added, and copies the rest.

    At 300,000 units reading every unit took ~90 ms of the event loop per capture; most units of a
    long run are done and never change again.
    """

    def __init__(self) -> None:
        self._cols: dict[str, list[Any]] = {name: [] for name in STATE_FIELDS}
        self._failed: dict[int, list[str]] = {}
        self._dirty: set[int] = set()

    def seed(self, table: Mapping[str, Any]) -> None:
        """Start from a format-2 snapshot's unit columns (what :func:`restore_unit_states` just
        set), so that the first capture after a restart reads only what changed since."""
        self._cols = {name: list(table[name]) for name in STATE_FIELDS}
        at, failed = table["failed_by"]
        self._failed = {i: list(f) for i, f in zip(at, failed, strict=True)}
        self._dirty.clear()

    def touch(self, u: UnitRecord) -> None:
        """``u`` changed (or is about to, before the next capture)."""
        self._dirty.add(u.index)

    def table(self, order: Sequence[UnitRecord]) -> dict[str, Any]:
        """The columns now (copies). A fresh instance reads every unit: what a cache must match."""
        cols, failed = self._cols, self._failed
        known = len(cols["state"])
        for i in self._dirty:
            if i < known:
                u = order[i]
                for name, get in _STATE_GETTERS.items():
                    cols[name][i] = get(u)
                self._note_failed(u)
        self._dirty.clear()
        for u in order[known:]:
            for name, get in _STATE_GETTERS.items():
                cols[name].append(get(u))
            self._note_failed(u)
        out: dict[str, Any] = {name: list(col) for name, col in cols.items()}
        at = sorted(failed)
        out["failed_by"] = [at, [list(failed[i]) for i in at]]
        return out

    def _note_failed(self, u: UnitRecord) -> None:
        if u.failed_by:
            self._failed[u.index] = sorted(u.failed_by)
        else:
            self._failed.pop(u.index, None)


class LeaseArchive:
    """Leases that are over (closed with a receipt, or superseded), as columns: they never change
    again, so each is written here once, when it ends."""

    def __init__(self) -> None:
        self._cols: dict[str, list[Any]] = {name: [] for name in LEASE_FIELDS if name != "remaining"}

    def __len__(self) -> int:
        return len(self._cols["lease_id"])

    def append(self, lease: LeaseRecord) -> None:
        assert lease.state is LeaseState.CLOSED or lease.state is LeaseState.SUPERSEDED, lease.state
        _append(self._cols, lease)

    def table(self, live: Iterable[LeaseRecord], now: float) -> dict[str, Any]:
        """Every lease: the archive (copied) and then ``live``, the leases still open, read now."""
        open_cols: dict[str, list[Any]] = {name: [] for name in self._cols}
        remaining: list[float] = []
        for lease in live:
            _append(open_cols, lease)
            remaining.append(lease.deadline - now if lease.state is LeaseState.ACTIVE else 0.0)
        out = {name: col + open_cols[name] for name, col in self._cols.items()}
        out["remaining"] = [0.0] * len(self) + remaining
        return out


def _append(cols: dict[str, list[Any]], lease: LeaseRecord) -> None:
    r = lease.receipt
    cols["lease_id"].append(lease.lease_id)
    cols["unit_id"].append(lease.unit_id)
    cols["worker_id"].append(lease.worker_id)
    cols["base_version"].append(lease.base_version)
    cols["steps_done"].append(lease.steps_done)
    cols["state"].append(lease.state._value_)
    cols["receipt_status"].append(None if r is None else r.status)
    cols["receipt_version"].append(None if r is None else r.version)
    cols["receipt_reason"].append(None if r is None else r.reason)


#: Snapshot columns of a worker: times relative to the capture (``since``: since last seen,
#: ``backoff``: left of its back-off).
WORKER_FIELDS = ("worker_id", "name", "info", "since", "spw", "streak", "failures", "backoff",
                 "quarantined", "last_failure")


def worker_table(workers: Iterable[WorkerRecord], now: float) -> dict[str, list[Any]]:
    ws = list(workers)
    return {"worker_id": [w.worker_id for w in ws], "name": [w.name for w in ws],
            "info": [w.info for w in ws], "since": [now - w.last_seen for w in ws],
            "spw": [w.spw for w in ws], "streak": [w.streak for w in ws],
            "failures": [w.failures for w in ws], "backoff": [w.backoff_until - now for w in ws],
            "quarantined": [w.quarantined for w in ws], "last_failure": [w.last_failure for w in ws],
            "left": [w.left for w in ws], "preempted": [w.preempted for w in ws]}


def worker_flag(table: Any, name: str) -> list[bool] | None:
    """A boolean column of a format-2 worker table: ``left`` (who said it exits) or ``preempted``
    (whose last act was a release that was nobody's fault); None where the table has none (a
    snapshot from before 2026-12-07: nobody had left, and nobody was kept preempted) or not a list
    of booleans."""
    col = table.get(name) if isinstance(table, Mapping) else None
    if not isinstance(col, list) or not all(isinstance(v, bool) for v in col):
        return None
    return col


# -- reading a snapshot back ---------------------------------------------------------------------

def _columns(table: Any, names: Iterable[str], what: str) -> tuple[list[list[Any]], int]:
    if not isinstance(table, Mapping):
        raise ConfigError(f"ledger snapshot: {what} is not a table")
    cols = []
    for name in names:
        col = table.get(name)
        if not isinstance(col, list):
            raise ConfigError(f"ledger snapshot: {what} lacks the column {name!r}")
        cols.append(col)
    n = len(cols[0])
    if any(len(c) != n for c in cols):
        raise ConfigError(f"ledger snapshot: {what} columns differ in length")
    return cols, n


def _sparse(table: Mapping[str, Any], name: str, n: int, what: str) -> dict[int, Any]:
    pair = table.get(name)
    if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(p, list) for p in pair)
            and len(pair[0]) == len(pair[1])):
        raise ConfigError(f"ledger snapshot: {what} lacks the column {name!r}")
    out = dict(zip(pair[0], pair[1], strict=True))
    if any(not isinstance(i, int) or not 0 <= i < n for i in out):
        raise ConfigError(f"ledger snapshot: {what} column {name!r} names a unit out of range")
    return out


def _known(states: Mapping[str, Any], name: Any, what: str) -> Any:
    try:
        return states[name]
    except (KeyError, TypeError):
        raise ConfigError(f"ledger snapshot: {what} state {name!r} is not one of "
                          f"{sorted(states)}") from None


def unit_specs(table: Any) -> list[WorkUnit]:
    """The units a format-2 snapshot's unit table describes, in order."""
    cols, n = _columns(table, SPEC_FIELDS, "units")
    params = _sparse(table, "params", n, "units")
    return [WorkUnit(uid, shard, num, epoch, steps, dict(params.get(i, {})))
            for i, (uid, shard, num, epoch, steps) in enumerate(zip(*cols, strict=True))]


def restore_unit_states(table: Mapping[str, Any], order: Sequence[UnitRecord]) -> None:
    """Set each unit's state from the table (counters are the caller's)."""
    cols, n = _columns(table, STATE_FIELDS, "units")
    if n != len(order):
        raise ConfigError("ledger snapshot: unit state columns do not match its units")
    failed = _sparse(table, "failed_by", n, "units")
    for u, (state, attempts, issued, lease_id, reason, done_by, last_failure) in zip(
            order, zip(*cols, strict=True), strict=True):
        u.state = _known(_UNIT_STATES, state, "unit")
        u.attempts, u.issued, u.lease_id = attempts, issued, lease_id
        u.reason, u.done_by, u.last_failure = reason, done_by, last_failure
        u.failed_by = set(failed.get(u.index, ()))


def worker_table_rows(table: Any) -> Iterable[tuple[Any, ...]]:
    """A format-2 worker table as format 1's rows (the field order of ``WORKER_FIELDS``)."""
    cols, _ = _columns(table, WORKER_FIELDS, "workers")
    return zip(*cols, strict=True)


def lease_records(table: Any, now: float) -> Iterable[tuple[LeaseRecord, float]]:
    """Each lease of the table and its remaining seconds (the caller sets active deadlines)."""
    cols, _ = _columns(table, LEASE_FIELDS, "leases")
    for (lid, unit_id, worker_id, base, remaining, steps, state, r_status, r_version,
         r_reason) in zip(*cols, strict=True):
        lease = LeaseRecord(lid, unit_id, worker_id, base, now, now,
                            _known(_LEASE_STATES, state, "lease"))
        lease.steps_done = steps
        if r_status is not None:
            lease.receipt = Receipt(lid, unit_id, receipt_status(r_status), int(r_version),
                                    r_reason)
        yield lease, remaining
