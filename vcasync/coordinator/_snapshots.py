"""Hand-over of snapshots from the merge loop (which captures) to the writer (which stores).

A capture must happen between two merges (the policy state and the ledger move with every merge),
but writing a 400 MB model must not stop merging. So the merge loop captures (holding the current
version, which is immutable, and packing the policy state) and leaves it here; the writer takes it.
A newer capture replaces one the writer has not taken yet; a failed write is retried unless a newer
capture arrived meanwhile. The held version is released once its capture is written or replaced.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ._journal import Captured, Journal
from ._model_owner import ModelOwner
from ._versions import Version

__all__ = ["SnapshotSlot"]


class SnapshotSlot:
    def __init__(self, journal: Journal, owner: ModelOwner) -> None:
        self._journal = journal
        self._owner = owner
        self._pending: tuple[Captured, Version] | None = None
        self.ready = asyncio.Event()
        #: the model version the newest written snapshot holds (or the state recovery started
        #: from, durable already); ``written`` is set at each write
        self.written_version = -1
        self.written = asyncio.Event()

    async def capture(self, ledger: dict[str, Any], unknown_from: int | None = None) -> None:
        """Merge loop only: take a consistent state now (the ledger snapshot is taken by the caller
        at the same point, between two merges). ``unknown_from``: the versions kept for leases no
        snapshot knows start there (see ``Recovered.unknown_from``)."""
        version = self._owner.hold(self._owner.version)
        assert version is not None
        try:
            state = await self._owner.pack_state()
        except BaseException:
            self._owner.release(version)
            raise
        self.drop()
        self._pending = (self._journal.capture(version.model, state, ledger,
                                               held=self._owner.held,
                                               unknown_from=unknown_from,
                                               renumbered=self._owner.renumbered_pairs()), version)
        self.ready.set()

    def drop(self) -> None:
        if self._pending is not None:
            self._owner.release(self._pending[1])
        self._pending = None
        self.ready.clear()

    async def write(self) -> bool:
        """Write the pending capture, if any; True when one was written."""
        taken, self._pending = self._pending, None
        self.ready.clear()
        if taken is None:
            return False
        try:
            await self._journal.write_snapshot(taken[0])
        except BaseException:
            self._retry_later(taken)
            raise
        self.written_version = max(self.written_version, taken[1].number)
        self.written.set()
        self._owner.release(taken[1])
        return True

    def retry(self) -> None:
        """Wake the writer for a capture whose write failed (it stays pending until written)."""
        if self._pending is not None:
            self.ready.set()

    def _retry_later(self, taken: tuple[Captured, Version]) -> None:
        if self._pending is None:
            self._pending = taken
        else:
            self._owner.release(taken[1])
