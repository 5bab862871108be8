"""``pack_tree`` / ``unpack_tree``: nested plain data with tensors inside, bit-exact.

For policy state, ledger snapshots and checkpoints: dicts (str keys), lists, tuples, str, bytes,
int (64-bit), float, bool, None and tensors of any allowed dtype, nested. The result is an ordinary
payload of kind ``"tree"``: the structure travels in the preamble's metadata with each tensor replaced
by a msgpack ext reference (code 1, its index) and each tuple by ext code 2; the tensors follow as
tensor frames. Only those two ext codes are understood, and they only ever build an index or a
tuple: nothing on the wire can name a class to construct. Tensors come back as separate copies
(aliasing between two entries is not preserved).
"""

from __future__ import annotations

import struct
from typing import Any

import msgpack
import torch

from ..errors import FrameError, LimitExceededError
from . import _msgpack
from .codecs import block_codec
from .decoder import PayloadDecoder
from .dtypes import dtype_name
from .encoder import iter_payload
from .limits import DEFAULT_LIMITS, Limits
from .plan import CodecSpec, resolve_codec

__all__ = ["check_tree", "pack_tree", "unpack_tree"]

_EXT_TENSOR = 1
_EXT_TUPLE = 2
_INDEX = struct.Struct("<I")
_INT_MIN, _INT_END = -(1 << 63), 1 << 64
_KIND = "tree"


class _Ref(_msgpack.Leaf):
    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


def pack_tree(obj: Any, *, codec: str | CodecSpec = "raw") -> bytes:
    """Bytes of ``obj`` (see the module docstring for what it may hold)."""
    tensors: dict[str, torch.Tensor] = {}
    skeleton = _skeleton(obj, tensors, "tree")
    spec = resolve_codec(codec)
    block_codec(spec.compression if spec.compression != "auto" else "zstd")
    return b"".join(iter_payload(_KIND, {"tree": skeleton}, tensors, spec, 1 << 20, False))


def check_tree(obj: Any) -> None:
    """Raise what :func:`pack_tree` would on ``obj``'s structure and tensor types, without packing:
    a ``TypeError`` naming the path of the first value it cannot hold (``tree.o: cannot pack a
    object``), or :class:`~vcasync.errors.UnsupportedDtypeError`. It walks the structure and looks
    at each tensor's dtype and layout, never its bytes: the coordinator runs it after every merge
    that may have changed a policy's state (microseconds for a state of a few entries, whatever the
    tensors' sizes)."""
    tensors: dict[str, torch.Tensor] = {}
    _skeleton(obj, tensors, "tree")
    for t in tensors.values():
        dtype_name(t.dtype)
        if t.layout != torch.strided:
            raise TypeError(f"a tensor of layout {t.layout} cannot be packed (dense tensors only)")


def _skeleton(obj: Any, tensors: dict[str, torch.Tensor], path: str) -> Any:
    if isinstance(obj, torch.Tensor):
        index = len(tensors)
        tensors[str(index)] = obj
        return msgpack.ExtType(_EXT_TENSOR, _INDEX.pack(index))
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if not isinstance(k, str):
                raise TypeError(f"{path}: dict keys must be str, got {type(k).__name__}")
            out[k] = _skeleton(v, tensors, f"{path}.{k}")
        return out
    if isinstance(obj, list):
        kinds = set(map(type, obj))
        if kinds <= _msgpack.EXACT_SCALARS:     # a column of plain values: packed as it is
            if int in kinds:
                _check_ints(obj if len(kinds) == 1 else [v for v in obj if type(v) is int], path)
            return obj
        return [_skeleton(v, tensors, f"{path}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, tuple):
        inner = [_skeleton(v, tensors, f"{path}[{i}]") for i, v in enumerate(obj)]
        return msgpack.ExtType(_EXT_TUPLE, _msgpack.pack(inner))
    if isinstance(obj, bool | str | bytes | float | type(None)):
        return obj
    if isinstance(obj, int):
        if not _INT_MIN <= obj < _INT_END:
            raise TypeError(f"{path}: int {obj} does not fit in 64 bits")
        return obj
    raise TypeError(f"{path}: cannot pack a {type(obj).__name__} (plain data and tensors only)")


def _check_ints(ints: list[int], path: str) -> None:
    if ints and not (min(ints) >= _INT_MIN and max(ints) < _INT_END):
        bad = next(v for v in ints if not _INT_MIN <= v < _INT_END)
        raise TypeError(f"{path}: int {bad} does not fit in 64 bits")


def unpack_tree(data: bytes | bytearray | memoryview, *, limits: Limits | None = None) -> Any:
    """The object :func:`pack_tree` packed; any problem raises a :class:`~vcasync.errors.WireError`."""
    limits = limits if limits is not None else DEFAULT_LIMITS
    depth = 0

    def hook(code: int, payload: bytes) -> Any:
        nonlocal depth
        if code == _EXT_TENSOR:
            if len(payload) != _INDEX.size:
                raise FrameError("tensor reference must be 4 bytes", field="tree.ref")
            return _Ref(_INDEX.unpack(payload)[0])
        if code == _EXT_TUPLE:
            depth += 1
            try:
                if depth > limits.max_depth:
                    raise LimitExceededError(
                        f"tree tuples nest deeper than the limit {limits.max_depth}",
                        field="tree.depth", limit=limits.max_depth, value=depth)
                inner = _msgpack.unpack(payload, limits, field="tree tuple",
                                        max_bytes=len(payload), ext_hook=hook)
            finally:
                depth -= 1
            if not isinstance(inner, list):
                raise FrameError("a packed tuple must hold a list", field="tree.tuple")
            return tuple(inner)
        raise FrameError(f"msgpack ext type {code} is not allowed in a tree", field="tree.ext")

    dec = PayloadDecoder(limits=limits, expected_kind=_KIND, ext_hook=hook)
    dec.feed(data)
    payload = dec.finish()
    if set(payload.meta) != {"tree"}:
        raise FrameError("a tree payload's meta must hold exactly 'tree'", field="tree")
    tensors = payload.tensors
    if list(tensors) != [str(i) for i in range(len(tensors))]:
        raise FrameError("tree tensors must be named 0..n-1 in order", field="tree.tensors")
    used: set[int] = set()
    result = _fill(payload.meta["tree"], tensors, used)
    if len(used) != len(tensors):
        raise FrameError(f"{len(tensors) - len(used)} tree tensors are never referenced",
                         field="tree.tensors")
    return result


def _fill(node: Any, tensors: dict[str, torch.Tensor], used: set[int]) -> Any:
    if isinstance(node, _Ref):
        if node.index in used or str(node.index) not in tensors:
            raise FrameError(f"tensor reference {node.index} is unknown or used twice",
                             field="tree.ref")
        used.add(node.index)
        return tensors[str(node.index)]
    if isinstance(node, dict):
        return {k: _fill(v, tensors, used) for k, v in node.items()}
    if isinstance(node, list):
        if _msgpack.all_scalars(node):     # no tensor reference inside: as msgpack made it
            return node
        return [_fill(v, tensors, used) for v in node]
    if isinstance(node, tuple):
        return tuple(_fill(v, tensors, used) for v in node)
    return node
