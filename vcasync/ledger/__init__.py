"""The ledger room: work units, leases and deadlines, a pure state machine with an injected clock.

No asyncio and no IO. The public names are re-exported here; the modules beside them are private:
``_ledger`` (the state machine), ``_units`` (the value types it hands out: units, grants, receipts),
``_types`` (its config, states and records), ``_lease_id`` (signed lease ids), ``_columns`` (its
snapshot as columns) and ``_plain`` (what a snapshot can hold of what workers and units bring).
"""

from __future__ import annotations

from ._ledger import (
    CAPTURED_WALL,
    LeaseGrant,
    LeaseState,
    Ledger,
    LedgerConfig,
    Receipt,
    ResultCheck,
    UnitState,
    WorkUnit,
    make_units,
)
from ._units import MAX_UNITS

__all__ = ["CAPTURED_WALL", "MAX_UNITS", "LeaseGrant", "LeaseState", "Ledger", "LedgerConfig", "Receipt",
           "ResultCheck", "UnitState", "WorkUnit", "make_units"]
