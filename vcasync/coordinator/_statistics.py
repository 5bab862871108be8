"""Running statistics (BatchNorm's ``running_mean``, ``running_var``): a rule of their own.

A model's floating-point buffers are not trained by gradients: each worker measures them on its own
batches, as its weights change. A merge policy's rule for weights (a server learning rate, outer
momentum, a sum of stale deltas) is meaningless for them and can push them out of range: measured
on 2026-12-07, fedbuff at its defaults and trimmed_mean with a buffer ended a BatchNorm model with a
``running_var`` below zero (10 % accuracy), diloco with one of 1,575 (9.7 %). So the coordinator
keeps them itself, for the names :attr:`ModelState.statistics` gives (``from_module`` names a
module's float buffers):

- every result's statistics become **values** before it is journaled or merged: a full-weights
  result carries them; a delta's are added to its base version's, which this keeps per version for
  the staleness window (they are small: two floats a channel). A delta whose base's statistics are
  not held (its base predates a restart) leaves its statistics out; the rest of it merges as usual.
- the policy sees what the result changes of them, in the result's kind (its values in full
  weights, a delta from its base for a policy given one, else from the model), so a policy that
  judges results (``gate``'s norm and direction) measures them too; what it makes of them is
  replaced when the version is published:
- each new version's statistics are the **element-wise median** of the values of the results merged
  into it since the previous version (one result: its values; two: their mean), whatever the
  policy: a buffering policy's K results give the median of K, robust to a few broken workers. A
  version whose results all left theirs out keeps the previous version's.

The values of results a policy holds unapplied (a buffer filling) are kept here until the version
that applies them, and go into snapshots (:meth:`Statistics.pack`), so a restart merges exactly what
the live run did. Everything here runs in the merge loop, in journal order, so replay decides the
same.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

from ..tensors import ModelState
from ._by_version import ByVersion

__all__ = ["LEFT_OUT", "STATISTICS_KEY", "VALUES", "Statistics", "restored_pending"]

#: Key of a snapshot's ledger map holding the statistics of results merged but not applied yet.
STATISTICS_KEY = "statistics_pending"

#: Marks a journaled result whose statistics are values.
VALUES = "value"
#: Marks a journaled delta whose base's statistics were not held: its statistics are left out on
#: replay too. An entry with neither mark was journaled before the rule: its statistics are replayed
#: as the policy merged them then (as any float tensor), so replay gives the versions that run had.
LEFT_OUT = "left_out"

Tensors = dict[str, torch.Tensor]


class Statistics:
    """The statistics of ``model`` (``names``), by version, and the values merged but not applied."""

    def __init__(self, names: Iterable[str], model: ModelState,
                 pending: Iterable[Mapping[str, torch.Tensor]] = ()) -> None:
        self._bases = ByVersion(names, model)
        self._names = self._bases.names
        self._legacy = False         # a journal entry from before the rule since the last version
        self._pending: list[Tensors] = [self._own(p) for p in pending if self._fits(p, model)]
        self.record(model)

    def _fits(self, values: Mapping[str, torch.Tensor], model: ModelState) -> bool:
        """Held values a snapshot kept that fit the model's statistics (a snapshot of a run whose
        statistics were named otherwise holds others: they are left out, as a delta's are)."""
        return len(values) == len(self._names) and all(
            isinstance(values.get(n), torch.Tensor) and values[n].shape == model[n].shape
            and values[n].dtype == model[n].dtype for n in self._names)

    def _own(self, values: Mapping[str, torch.Tensor]) -> Tensors:
        return {n: values[n].detach().clone() for n in self._names}

    @property
    def empty(self) -> bool:
        """True when the model has no statistics (then nothing here does anything)."""
        return not self._names

    @property
    def pending(self) -> int:
        """Results merged since the last version whose statistics wait to be applied."""
        return len(self._pending)

    # -- versions ----------------------------------------------------------------------------------
    def record(self, model: ModelState) -> None:
        """Keep the statistics of a newly published version (shared when unchanged)."""
        if self._names:
            self._bases.record(model)

    def adopt(self, model: ModelState) -> None:
        """Keep the statistics of an older version read back at a restart."""
        if self._names:
            self._bases.adopt(model)

    def retain(self, floor: int) -> None:
        """Forget versions below ``floor`` (the newest is always kept)."""
        self._bases.retain(floor)

    # -- a result ----------------------------------------------------------------------------------
    def to_values(self, tensors: Mapping[str, torch.Tensor], kind: str, base_version: int) -> bool:
        """Turn a result's statistics into values, in place (a delta's plus its base's); False, with
        nothing changed, when its base's statistics are not held or the sum is not finite (a
        float16 past its range): then the result's statistics are left out."""
        if not self._names:
            return False
        if kind == "weights":
            return True
        base = self._bases.get(base_version)
        if base is None:
            return False
        sums = {n: tensors[n] + base[n] for n in self._names}
        if not all(bool(torch.isfinite(t).all()) for t in sums.values()):
            return False
        for name, t in sums.items():
            tensors[name].copy_(t)
        return True

    def for_policy(self, policy_view: dict[str, torch.Tensor], kind: str, model: ModelState,
                   base: ModelState | None) -> Tensors:
        """Put into ``policy_view`` (the policy's own mapping of a result whose statistics are
        values) what the result changes of them, in the result's kind: its values in full weights,
        a delta from its base for a policy given one, else from the model. The policy can measure
        it (``gate`` refuses a result whose statistics are extreme), and what it makes of them is
        replaced when the version is published (:meth:`apply`). Returns copies of the values, so no
        tensor of the result stays referenced: its set goes back to the buffer pool."""
        values = {n: policy_view[n].detach().clone() for n in self._names}
        if kind != "weights":
            for name in self._names:
                policy_view[name] = values[name] - (base if base is not None else model)[name]
        return values

    def note_legacy(self) -> None:
        """A journal entry from before the rule is being replayed: the policy merges its statistics
        as it did then, and the next version keeps what the policy made of them when no values
        are held (see :meth:`apply`)."""
        self._legacy = True

    def hold(self, values: Mapping[str, torch.Tensor]) -> None:
        """A merged result's values (:meth:`for_policy`'s copies, kept as they are): applied with
        the next version."""
        self._pending.append({n: values[n] for n in self._names})

    def apply(self, working: ModelState) -> None:
        """Set ``working``'s statistics (the version about to be published) to the element-wise
        median of the values held (the mean of the middle two for an even count), and forget them.
        With none held (the results it applies left theirs out) they stay the previous version's,
        whatever the policy made of them; but a version that applies journal entries from before
        the rule keeps the policy's, as that run published it."""
        legacy, self._legacy = self._legacy, False
        if not self._names:
            return
        if not self._pending:
            if not legacy:
                previous = self._bases.newest()
                for name in self._names:
                    working[name].copy_(previous[name])
            return
        for name in self._names:
            stack = torch.stack([p[name] for p in self._pending])
            if len(self._pending) == 1:
                value = stack[0]
            else:
                ordered = stack.to(torch.float64).sort(dim=0).values
                n = len(self._pending)
                value = ((ordered[(n - 1) // 2] + ordered[n // 2]) / 2).to(stack.dtype)
            working[name].copy_(value)
        self._pending.clear()

    def forget_pending(self) -> None:
        """Drop the values held (the policy that held their results was replaced)."""
        self._pending.clear()

    # -- snapshots ---------------------------------------------------------------------------------
    def pack(self) -> list[Tensors]:
        """The values held, for a snapshot (copies: the merge loop goes on meanwhile)."""
        return [self._own(p) for p in self._pending]


def restored_pending(ledger: Mapping[str, Any]) -> list[Tensors]:
    """The held values a snapshot's ledger map kept (none in snapshots from before the rule)."""
    pending = ledger.get(STATISTICS_KEY)
    if not isinstance(pending, list):
        return []
    return [dict(p) for p in pending if isinstance(p, Mapping)]
