"""Model state and updates: the small public types every room of vcasync shares.

``ModelState`` is an ordered mapping of names to tensors plus a version number, built from and loaded
into an ``nn.Module``'s ``state_dict()`` (parameters *and* buffers: BatchNorm running statistics and
integer counters included). Its :class:`ModelSpec` (names, shapes, dtypes) is what every incoming
result is validated against. ``Update`` is one worker's result as a merge policy sees it.
"""

from __future__ import annotations

import hashlib
import math
import operator
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from .errors import ConfigError, SpecMismatchError, ValidationError

__all__ = ["ModelSpec", "ModelState", "TensorSpec", "Update", "UpdateKind", "all_finite",
           "counter_increments", "is_counter", "make_delta", "tensor_bytes"]

UpdateKind = Literal["delta", "weights"]

def _not_dense(name: str, t: torch.Tensor) -> str | None:
    """Why ``t`` holds no dense values to copy (sparse, or on the meta device), or None; the
    model's checks say it in these words (:meth:`ModelState.from_module`, the coordinator's
    ``unmergeable``)."""
    if t.layout != torch.strided:
        return f"tensor {name!r} is {t.layout} (not dense): pass dense tensors (.to_dense())"
    if t.device.type == "meta":
        return f"tensor {name!r} is on the meta device: it holds no values to train from"
    return None


#: Elements per slice when a dtype has no min/max kernel (the float8 family) and is checked upcast.
_FINITE_SLICE = 1 << 20


def all_finite(t: torch.Tensor) -> bool:
    """Whether every element of a floating or complex tensor is finite (other dtypes: True).

    One read of the tensor and no tensor-sized temporary: its minimum and maximum propagate NaN and
    are infinite when any element is (``torch.isfinite(t).all()`` allocates a bool tensor as large as
    ``t`` and runs 20-30x slower on a 100 MB update). Dtypes without a CPU min/max kernel are
    upcast to float32 a slice at a time.
    """
    if not (t.is_floating_point() or t.is_complex()) or t.numel() == 0:
        return True
    flat = (torch.view_as_real(t) if t.is_complex() else t).reshape(-1)
    try:
        return _extremes_finite(flat)
    except (RuntimeError, NotImplementedError):   # e.g. "aminmax_cpu" not implemented for float8
        return all(_extremes_finite(flat[i:i + _FINITE_SLICE].float())
                   for i in range(0, flat.numel(), _FINITE_SLICE))


def _extremes_finite(flat: torch.Tensor) -> bool:
    lo, hi = torch.aminmax(flat)
    return math.isfinite(float(lo)) and math.isfinite(float(hi))


def is_counter(t: torch.Tensor) -> bool:
    """Integer tensors are counters: they travel and merge as increments (:mod:`vcasync.policy`)."""
    return not (t.is_floating_point() or t.is_complex() or t.dtype == torch.bool)


def make_delta(base: Mapping[str, torch.Tensor],
               trained: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The body of a ``kind = "delta"`` result: what a worker uploads after training from ``base``.

    ``trained - base`` (in the base's dtype) for floating-point and integer tensors (for a counter
    the difference is its increment), and the trained value for bool tensors (a difference of
    flags means nothing). Names must match; the result is contiguous CPU tensors.
    """
    if set(trained) != set(base):
        raise SpecMismatchError("the trained tensors do not match the base model's names",
                                reason="missing_tensor")
    out: dict[str, torch.Tensor] = {}
    for name, b in base.items():
        t = trained[name].detach().cpu()
        if b.dtype == torch.bool:
            out[name] = t.to(torch.bool).contiguous()
        else:
            out[name] = (t.to(b.dtype) - b.detach().cpu()).contiguous()
    return out


def counter_increments(tensors: Mapping[str, torch.Tensor],
                       base: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A full-weights result as a merge policy sees it: integer tensors become ``value - base``.

    Other tensors are passed through (the same objects). ``base`` needs only the integer tensors
    of the version the worker trained from.
    """
    return {n: torch.sub(t, base[n]) if is_counter(t) else t for n, t in tensors.items()}


def tensor_bytes(t: torch.Tensor) -> memoryview:
    """The tensor's elements as little-endian bytes, without a copy when it is contiguous on CPU."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    flat = t.reshape(-1)
    if flat.numel() == 0:
        return memoryview(b"")
    if flat.stride(0) != 1:
        # torch calls a 1-element tensor contiguous whatever its stride; a byte view needs stride 1
        flat = flat.as_strided((flat.numel(),), (1,))
    arr: Any = flat.view(torch.uint8).numpy()
    return memoryview(arr).cast("B")


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """What one named tensor must look like."""

    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    @classmethod
    def of(cls, t: torch.Tensor) -> TensorSpec:
        return cls(tuple(int(d) for d in t.shape), t.dtype)


class ModelSpec(Mapping[str, TensorSpec]):
    """Ordered names -> :class:`TensorSpec`; validates incoming tensors against the model."""

    __slots__ = ("_specs",)

    def __init__(self, specs: Mapping[str, TensorSpec]) -> None:
        self._specs: dict[str, TensorSpec] = dict(specs)

    @classmethod
    def of(cls, tensors: Mapping[str, torch.Tensor]) -> ModelSpec:
        return cls({name: TensorSpec.of(t) for name, t in tensors.items()})

    def __getitem__(self, name: str) -> TensorSpec:
        return self._specs[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._specs)

    def __len__(self) -> int:
        return len(self._specs)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ModelSpec):
            return list(self._specs.items()) == list(other._specs.items())
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self._specs.values())

    def __repr__(self) -> str:
        return f"ModelSpec({len(self)} tensors, {self.nbytes} bytes)"

    def check(self, tensors: Mapping[str, torch.Tensor], *, require_finite: bool = False) -> None:
        """Raise :class:`SpecMismatchError` (or :class:`ValidationError`) naming the first problem."""
        missing = [n for n in self._specs if n not in tensors]
        if missing:
            raise SpecMismatchError(f"update lacks tensor {missing[0]!r} ({len(missing)} missing)",
                                    reason="missing_tensor", name=missing[0])
        extra = [n for n in tensors if n not in self._specs]
        if extra:
            raise SpecMismatchError(f"update has unknown tensor {extra[0]!r}",
                                    reason="unknown_tensor", name=extra[0])
        for name, spec in self._specs.items():
            t = tensors[name]
            if t.dtype != spec.dtype:
                raise SpecMismatchError(
                    f"tensor {name!r} has dtype {t.dtype}, the model has {spec.dtype}",
                    reason="dtype_mismatch", name=name)
            if tuple(t.shape) != spec.shape:
                raise SpecMismatchError(
                    f"tensor {name!r} has shape {tuple(t.shape)}, the model has {spec.shape}",
                    reason="shape_mismatch", name=name)
            if require_finite and not all_finite(t):
                raise ValidationError(f"tensor {name!r} holds NaN or Inf",
                                      reason="non_finite", name=name)


def _checked_tensors(tensors: object) -> dict[str, torch.Tensor]:
    """``tensors`` as a dict of name -> tensor, or a :class:`ConfigError` naming the fix. Checked when
    the state is built: a wrong value would otherwise surface as an ``AttributeError`` deep inside a
    merge, a digest or the wire encoder."""
    if isinstance(tensors, torch.nn.Module):
        raise ConfigError(f"ModelState takes tensors, not a {type(tensors).__name__} module: "
                          "use ModelState.from_module(module)")
    if not isinstance(tensors, Mapping):
        raise ConfigError(f"ModelState takes a mapping of name -> torch.Tensor (e.g. a state_dict()), "
                          f"got {type(tensors).__name__}")
    out: dict[str, torch.Tensor] = dict(tensors)
    for name, t in out.items():
        if not isinstance(name, str) or not name:
            raise ConfigError(f"ModelState tensor names must be non-empty str, got {name!r}")
        if not isinstance(t, torch.Tensor):
            raise ConfigError(f"ModelState tensor {name!r} is a {type(t).__name__}, not a torch.Tensor: "
                              f"wrap it, e.g. torch.tensor({t!r:.40})")
    return out


def _checked_statistics(statistics: object, tensors: Mapping[str, torch.Tensor]) -> frozenset[str]:
    """``statistics`` as a set of names of floating-point tensors of ``tensors``, or a ConfigError."""
    if isinstance(statistics, str) or not isinstance(statistics, Iterable):
        raise ConfigError(f"ModelState statistics must be a collection of tensor names, got "
                          f"{statistics!r:.80}")
    names = frozenset(statistics)
    for name in sorted(names, key=str):
        t = tensors.get(name) if isinstance(name, str) else None
        if t is None:
            raise ConfigError(f"ModelState statistics name {name!r:.80}, which is not one of its tensors")
        if not t.is_floating_point():
            raise ConfigError(f"ModelState statistic {name!r} is {t.dtype}: statistics are "
                              "floating-point tensors (integer ones are counters already)")
    return names


def _float_buffers(module: torch.nn.Module, state: Mapping[str, torch.Tensor]) -> frozenset[str]:
    """The names in ``state`` (``module.state_dict()``) of ``module``'s floating-point buffers:
    running statistics such as BatchNorm's ``running_mean`` and ``running_var``. A name that is
    also a parameter's (a tie) is not one."""
    params = {name for name, _ in module.named_parameters(remove_duplicate=False)}
    return frozenset(name for name, b in module.named_buffers(remove_duplicate=False)
                     if name in state and name not in params and b.is_floating_point())


def _checked_ties(ties: object, tensors: Mapping[str, torch.Tensor]) -> tuple[tuple[str, ...], ...]:
    """``ties`` as groups of two or more names of ``tensors`` with one dtype and shape each, no name
    in two groups, or a ConfigError."""
    if isinstance(ties, str) or not isinstance(ties, Iterable):
        raise ConfigError(f"ModelState ties must be a collection of groups of tensor names, got "
                          f"{ties!r:.80}")
    out: list[tuple[str, ...]] = []
    seen: set[str] = set()
    for group in ties:
        if isinstance(group, str) or not isinstance(group, Iterable):
            raise ConfigError(f"ModelState tie {group!r:.80} is not a group of tensor names")
        names = tuple(group)
        if len(names) < 2 or len(set(names)) != len(names):
            raise ConfigError(f"ModelState tie {names!r:.80} needs two or more distinct names")
        for name in names:
            t = tensors.get(name) if isinstance(name, str) else None
            if t is None:
                raise ConfigError(f"ModelState tie names {name!r:.80}, which is not one of its tensors")
            if name in seen:
                raise ConfigError(f"ModelState tensor {name!r} is in two ties: one group per tensor")
            seen.add(name)
            first = tensors[names[0]]
            if t.dtype != first.dtype or t.shape != first.shape:
                raise ConfigError(f"ModelState tie {names[0]!r} = {name!r}: tied tensors have one "
                                  "dtype and shape")
        out.append(names)
    return tuple(out)


def _tied_names(state: Mapping[str, torch.Tensor]) -> tuple[tuple[str, ...], ...]:
    """The groups of names in ``state`` (a ``state_dict()``) that are one tensor: the same storage,
    offset, shape, stride and dtype (a language model's head tied to its embedding). Empty tensors
    tie nothing (they share no values, and may share a null pointer)."""
    groups: dict[tuple[object, ...], list[str]] = {}
    for name, t in state.items():
        if t.numel() == 0:
            continue
        key = (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape),
               t.stride(), t.dtype)
        groups.setdefault(key, []).append(name)
    return tuple(tuple(names) for names in groups.values() if len(names) > 1)


def _checked_version(version: object) -> int:
    if isinstance(version, bool) or not hasattr(version, "__index__"):
        raise ConfigError(f"ModelState version must be an int, got {version!r}")
    v = operator.index(version)
    if v < 0:
        raise ConfigError(f"ModelState version must be >= 0, got {v}")
    return v


class ModelState(Mapping[str, torch.Tensor]):
    """Ordered named tensors plus a version; ``digest()`` hashes names, specs and bytes.

    The mapping is the model: merge policies may update its tensors in place (the owner decides),
    so ``clone()`` before handing out a copy that must not change.
    """

    __slots__ = ("_tensors", "statistics", "ties", "version")

    def __init__(self, tensors: Mapping[str, torch.Tensor], version: int = 0, *,
                 statistics: Iterable[str] = (), ties: Iterable[Iterable[str]] = ()) -> None:
        """``statistics``: the names of floating-point tensors that are running statistics, not
        trained weights (BatchNorm's ``running_mean`` and ``running_var``: a module's float
        buffers, which :meth:`from_module` names). A coordinator gives them a rule of their own:
        the median of the values the merged results carry, never a policy's step (which can push a
        variance below zero); see "Running statistics" in docs/policies.md.

        ``ties``: groups of names that are one tensor in the module (a head tied to an embedding:
        ``state_dict()`` names it twice), which :meth:`from_module` finds. Each name holds its own
        copy here (a merge updates each name on its own); a coordinator refuses a result whose
        tied names differ (see "Refused results" in docs/trainer.md)."""
        self._tensors: dict[str, torch.Tensor] = _checked_tensors(tensors)
        self.version = _checked_version(version)
        self.statistics: frozenset[str] = _checked_statistics(statistics, self._tensors)
        self.ties: tuple[tuple[str, ...], ...] = _checked_ties(ties, self._tensors)

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def from_module(cls, module: torch.nn.Module, version: int = 0) -> ModelState:
        """Detached CPU copies of every parameter and buffer in ``module.state_dict()``; a sparse or
        meta tensor among them (no dense values to copy) is a :class:`ConfigError` naming it.
        Names that share one tensor (tied weights) are recorded as :attr:`ties`."""
        if not isinstance(module, torch.nn.Module):
            raise ConfigError(f"from_module takes a torch.nn.Module, got {type(module).__name__}; "
                              "a mapping of tensors goes to ModelState(tensors) itself")
        sd = module.state_dict()
        for k, v in sd.items():
            # named here: copying one raised torch's own words (a sparse tensor: "unsupported
            # memory format option Contiguous"; a meta one: "Cannot copy out of meta tensor")
            why = _not_dense(k, v)
            if why is not None:
                raise ConfigError(f"from_module: {why}")
        return cls({k: v.detach().to("cpu", copy=True).contiguous() for k, v in sd.items()},
                   version, statistics=_float_buffers(module, sd), ties=_tied_names(sd))

    def load_into(self, module: torch.nn.Module, *, strict: bool = True) -> None:
        """Copy these tensors into ``module`` (parameters and buffers)."""
        module.load_state_dict(dict(self._tensors), strict=strict)

    def clone(self, version: int | None = None) -> ModelState:
        return ModelState({k: v.clone() for k, v in self._tensors.items()},
                          self.version if version is None else version, statistics=self.statistics,
                          ties=self.ties)

    # -- mapping ------------------------------------------------------------------------------
    def __getitem__(self, name: str) -> torch.Tensor:
        return self._tensors[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)

    def __repr__(self) -> str:
        return f"ModelState(version={self.version}, {len(self)} tensors, {self.nbytes} bytes)"

    @property
    def tensors(self) -> dict[str, torch.Tensor]:
        """The underlying dict (not a copy)."""
        return self._tensors

    @property
    def spec(self) -> ModelSpec:
        return ModelSpec.of(self._tensors)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self._tensors.values())

    def digest(self) -> str:
        """BLAKE2b-128 over names, dtypes, shapes and raw bytes, in order (hex)."""
        h = hashlib.blake2b(digest_size=16)
        for name, t in self._tensors.items():
            h.update(name.encode())
            h.update(b"\0")
            h.update(str(t.dtype).encode())
            h.update(repr(tuple(t.shape)).encode())
            h.update(tensor_bytes(t))
        return h.hexdigest()

    def equal(self, other: Mapping[str, torch.Tensor]) -> bool:
        """Bit-for-bit equality of names, dtypes, shapes and values (NaN payloads included)."""
        if list(self._tensors) != list(other):
            return False
        for name, t in self._tensors.items():
            o = other[name]
            if t.dtype != o.dtype or t.shape != o.shape:
                return False
            if bytes(tensor_bytes(t)) != bytes(tensor_bytes(o)):
                return False
        return True


@dataclass(slots=True)
class Update:
    """One worker's result, as a merge policy sees it.

    ``tensors`` is a delta (``w_c - w_base``) when ``kind == "delta"``, else the full weights
    ``w_c``, for the floating-point tensors. Integer tensors hold the worker's increment
    (``w_c - w_base``) and bool tensors its value, in both kinds (:mod:`vcasync.policy` says why;
    :func:`counter_increments` turns a full-weights result into this form). ``staleness`` is
    ``v_now - base_version``, set by the coordinator before merging.
    ``base`` is the model at ``base_version`` when the coordinator still has it (policies that need
    ``w_c`` from a delta use it); it is never mutated.
    """

    tensors: dict[str, torch.Tensor]
    kind: UpdateKind = "delta"
    base_version: int = 0
    staleness: int = 0
    samples: int = 0
    steps: int = 0
    worker_id: str = ""
    unit_id: str = ""
    metrics: dict[str, float] = field(default_factory=dict)
    base: ModelState | None = None
