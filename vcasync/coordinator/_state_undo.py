"""The policy state as it was before a merge, to put back exactly when the merge fails.

A policy changes its state (``merge(model, update, state)``) in place: counters, momentum, buffers.
A merge that fails half-way (it raised, broke the model's spec, left the model non-finite or its
state unstorable) would leave that state half-updated, and every later merge would build on it.
:class:`StateUndo` takes the state before each merge and restores it when the merge fails.

Taking it must cost little on every merge. Containers and scalars are copied (a few microseconds:
the state's structure, no bytes). Tensors are copied into buffers kept from one merge to the next
(no allocation), and only those changed since their last copy: PyTorch counts every in-place change
of a tensor (its version counter, shared with its views), so a tensor whose count has not moved
still holds the values copied. A policy that changes a state tensor behind PyTorch's back (through
``.data``, or a NumPy view of it) defeats the count: the contract has it change its state through
torch operations on the tensors themselves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..policy import PolicyState

__all__ = ["StateUndo"]


@dataclass(slots=True)
class _Copy:
    tensor: torch.Tensor     # the state's own tensor (held, so its id stays its own)
    version: int | None      # its version counter when copied (None: it has none, copy every time)
    saved: torch.Tensor      # its values then


def _version(t: torch.Tensor) -> int | None:
    try:
        return int(t._version)
    except RuntimeError:     # an inference-mode tensor counts nothing
        return None


@dataclass(frozen=True, slots=True)
class _Node:
    kind: type               # dict, list or tuple
    items: tuple[tuple[Any, Any], ...]


class StateUndo:
    """Takes a policy state (:meth:`take`) and puts it back (:meth:`restore`); the merge loop's."""

    def __init__(self) -> None:
        self._copies: dict[int, _Copy] = {}     # id(tensor) -> its copy, kept between merges

    def take(self, state: PolicyState) -> object:
        """The state as it is now, for :meth:`restore` (valid until the next :meth:`take`)."""
        seen: dict[int, _Copy] = {}
        taken = self._freeze(state, seen)
        self._copies = seen       # tensors no longer in the state are let go
        return taken

    def restore(self, state: PolicyState, taken: object) -> None:
        """Put ``state`` back as it was when ``taken`` was taken: the same dict object, the same
        tensor objects (their values copied back) and containers and scalars equal to then."""
        rebuilt = self._thaw(taken)
        assert isinstance(rebuilt, dict)
        state.clear()
        state.update(rebuilt)

    def _freeze(self, value: Any, seen: dict[int, _Copy]) -> Any:
        if isinstance(value, torch.Tensor):
            return self._copy(value, seen)
        if isinstance(value, dict | list | tuple):
            pairs = value.items() if isinstance(value, dict) else enumerate(value)
            kind = dict if isinstance(value, dict) else list if isinstance(value, list) else tuple
            return _Node(kind, tuple((k, self._freeze(v, seen)) for k, v in pairs))
        return value              # a scalar, a string or None: nothing changes it in place

    def _copy(self, t: torch.Tensor, seen: dict[int, _Copy]) -> _Copy:
        key = id(t)
        copy = seen.get(key) or self._copies.get(key)
        version = _version(t)
        if copy is not None and copy.tensor is t:
            if version is None or copy.version != version:
                if copy.saved.shape == t.shape and copy.saved.dtype == t.dtype:
                    with torch.no_grad():
                        copy.saved.copy_(t)
                else:
                    copy.saved = t.detach().clone()
                copy.version = version
        else:
            copy = _Copy(t, version, t.detach().clone())
        seen[key] = copy
        return copy

    def _thaw(self, node: Any) -> Any:
        if isinstance(node, _Copy):
            t, saved = node.tensor, node.saved
            if node.version is not None and _version(t) == node.version:
                return t          # not changed since it was copied
            if t.shape != saved.shape or t.dtype != saved.dtype:
                return saved.clone()
            with torch.no_grad():
                t.copy_(saved)
            node.version = _version(t)    # equal to the copy again
            return t
        if isinstance(node, _Node):
            if node.kind is dict:
                return {k: self._thaw(v) for k, v in node.items}
            return node.kind(self._thaw(v) for _, v in node.items)
        return node
