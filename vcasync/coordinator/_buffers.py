"""Recycled tensor sets: model-sized buffers reused instead of allocated afresh.

A 100 MB allocation is fresh pages, and the first write to each page faults: filling new memory
runs at a fraction of a copy into pages already mapped (see BENCHMARKS.md). The coordinator keeps a
few complete tensor sets of the model's spec in one pool, for decoding uploads into and for
publishing versions (a merged result's set is given back before the new version is copied, so it
is usually the one that takes it), and takes them back once nothing uses them.

A set is only handed out again when nobody else can still see it: no Python reference to any of
its tensors beyond the pool's mapping, and no view of their memory (a slice, a numpy array) alive.
A policy that kept a reference to a result's tensors (against the contract) or a download still
streaming one therefore never sees the memory change under it; the set is simply not reused. The
check runs when a set is taken, not when it is given back: a worker thread that just finished with
a set may drop its last reference a moment after its result reached the event loop.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping

import torch

from ..tensors import ModelSpec

__all__ = ["BufferPool", "unshared"]

Tensors = dict[str, torch.Tensor]

_use_count: Callable[[int], int] | None = getattr(torch._C, "_storage_Use_Count", None)
#: ``sys.getrefcount`` of a tensor that only ``tensors`` holds, seen inside :func:`unshared`: the
#: mapping's entry, the loop variable and the call's own argument.
_OWN_REFS = 3
#: Storage use count of a tensor nobody views: the tensor itself and the temporary storage object.
_OWN_USES = 2


def unshared(tensors: Mapping[str, torch.Tensor]) -> bool:
    """Whether the caller's mapping holds the only references to these tensors and their memory.

    Without torch's storage use count (a private API) nothing is ever judged unshared.
    """
    if _use_count is None:
        return False
    for t in tensors.values():
        if sys.getrefcount(t) > _OWN_REFS or t._base is not None:
            return False
        if _use_count(t.untyped_storage()._cdata) > _OWN_USES:
            return False
    return True


class BufferPool:
    """Up to ``capacity`` spare tensor sets of one spec (CPU, contiguous); never more."""

    def __init__(self, spec: ModelSpec, capacity: int) -> None:
        self._spec = spec
        self._capacity = capacity
        self._free: list[Tensors] = []

    def __len__(self) -> int:
        return len(self._free)

    def take(self) -> Tensors | None:
        """A spare set nobody else holds (contents undefined), or None: then the caller allocates.
        Sets still held elsewhere are dropped here (their holders keep them alive)."""
        while self._free:
            tensors = self._free.pop()
            if unshared(tensors):
                return tensors
        return None

    def give(self, tensors: Tensors) -> bool:
        """Keep ``tensors`` for reuse when there is room and they fit the spec; True if kept. The
        giver lets go of them: whether anyone else still holds them is checked by :meth:`take`."""
        if len(self._free) >= self._capacity or not self._fits(tensors):
            return False
        self._free.append(tensors)
        return True

    def _fits(self, tensors: Tensors) -> bool:
        if len(tensors) != len(self._spec):
            return False
        for name, ts in self._spec.items():
            t = tensors.get(name)
            if (t is None or t.dtype != ts.dtype or tuple(t.shape) != ts.shape or not t.is_cpu
                    or not t.is_contiguous() or t.requires_grad):
                return False
        return True
