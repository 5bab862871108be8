"""The Coordinator's constructor checks: each argument of the wrong kind is a :class:`ConfigError`
that names the fix, raised when the Coordinator is built (not an ``AttributeError`` on first use).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

import torch

from ..errors import ConfigError, VCAsyncError
from ..ledger._units import WorkUnit, check_user_params
from ..policy import MergePolicy
from ..storage import Storage, _missing_storage_members
from ..tensors import ModelState, _not_dense
from ..wire import pack_tree
from ._config import CoordinatorConfig
from ._model_owner import first_non_finite

__all__ = ["check_arguments", "check_initial_state", "unmergeable"]


def _arithmetic(dtype: torch.dtype) -> bool:
    """Whether torch can do a merge's arithmetic in ``dtype`` on the CPU: subtract and add (a
    delta, a counter's increment) and sum (the finiteness check) two one-element tensors."""
    one = torch.zeros(1, dtype=dtype)
    try:
        (one - one).add_(one).sum()
    except (RuntimeError, NotImplementedError):   # "add_stub" not implemented for 'UInt16'
        return False
    return True


def _unsigned(dtype: torch.dtype) -> bool:
    """An unsigned integer dtype (uint8 to uint64); bool is not one: it merges as a value."""
    return not (dtype.is_floating_point or dtype.is_complex or dtype.is_signed
                or dtype == torch.bool)


def unmergeable(tensors: Mapping[str, torch.Tensor]) -> str | None:
    """Why the first tensor no merge can handle cannot be, or None: a sparse or meta tensor (no
    dense values to copy), a complex one (the merge rules know real values, counters and bools:
    the policies users write from the docs' examples would add complex weights as counters), an
    unsigned integer (uint8 to uint64: a counter whose increments could
    not go below zero, so a decrease would wrap to a huge increase and the negative-increment
    check could not see it), or a dtype torch has no CPU arithmetic for (the float8 family: the
    wire carries them, but a merge could not subtract, add or mix them, so the first result would
    fail the worker's ``make_delta`` or the policy, which would be blamed for it)."""
    seen: dict[torch.dtype, bool] = {}
    for name, t in tensors.items():
        dense = _not_dense(name, t)
        if dense is not None:
            return dense
        if t.is_complex():
            return (f"tensor {name!r} has dtype {t.dtype}: a merge treats every tensor as a real "
                    "value to average, an integer counter or a bool mask, and complex is none of "
                    "these (a policy written for them would add its values up as a counter's): "
                    "keep it as its real and imaginary parts, torch.view_as_real(z) (a float "
                    "tensor with a last dimension of 2), in the model's state dict")
        if _unsigned(t.dtype):
            return (f"tensor {name!r} has dtype {t.dtype}: integer tensors are counters, merged by "
                    "adding each worker's increment, and an unsigned one cannot hold an increment "
                    "below zero (a uint8 mask cleared from 1 to 0 would come back as 255) nor, "
                    "beyond uint8, be added on the CPU: keep a mask as bool (the last merged value "
                    "wins) and a counter as int32 or int64 in the model's state dict")
        if t.dtype not in seen:
            seen[t.dtype] = t.dtype == torch.bool or _arithmetic(t.dtype)
        if not seen[t.dtype]:
            wider = ("int32 or int64" if not t.is_floating_point()
                     else "float16, bfloat16 or float32")
            return (f"tensor {name!r} has dtype {t.dtype}, which torch cannot add or subtract on "
                    f"the CPU, as every merge does: keep it as {wider} in the model's state dict")
    return None


def check_arguments(model: object, units: object, policy: object, storage: object, config: object,
                     clock: object) -> list[WorkUnit]:
    """A :class:`ConfigError` naming the fix for each argument of the wrong kind, when the
    Coordinator is built: otherwise it surfaces as an ``AttributeError`` on first use, or later.
    Returns the units as a list."""
    if isinstance(model, torch.nn.Module):
        raise ConfigError(f"model is a {type(model).__name__} module; pass its state: "
                          "Coordinator(ModelState.from_module(module), ...)")
    if not isinstance(model, ModelState):
        raise ConfigError(f"model must be a vcasync.ModelState, got {type(model).__name__}")
    why = unmergeable(model.tensors)
    if why is not None:
        raise ConfigError(f"the initial model's {why}; nothing was started")
    bad = first_non_finite(model.tensors)
    if bad is not None:
        # served as it is, every worker's trainer would fail on it and be blamed for it
        raise ConfigError(f"the initial model's tensor {bad!r} is not finite (NaN or inf): the model "
                          "factory (--model) must give finite weights; nothing was started")
    if isinstance(units, (str, bytes)) or not isinstance(units, Iterable):
        raise ConfigError(f"units must be a sequence of WorkUnit (see make_units), "
                          f"got {type(units).__name__}")
    listed = list(units)        # once: a generator of units is fine, and is read here only
    bad = next((u for u in listed if not isinstance(u, WorkUnit)), None)
    if bad is not None:
        raise ConfigError(f"units must be WorkUnit objects (see make_units), got a {type(bad).__name__}")
    for unit in listed:
        check_user_params(unit.params, f"work unit {unit.unit_id!r}")
    if not isinstance(policy, MergePolicy):
        raise ConfigError(f"policy {policy!r} does not implement MergePolicy; build one with "
                          "build_policy(name)")
    if isinstance(storage, (str, os.PathLike)):
        # Refused rather than opened here: a storage is an async resource, and whoever opens it
        # closes it. Opening it behind the caller's back would leave nothing to close it with.
        raise ConfigError(f"storage is the URL {str(storage)!r}, not an open Storage: open it "
                          "yourself, `async with open_storage(url) as storage:`, and pass storage")
    if storage is not None and not isinstance(storage, Storage):
        lacks = ", ".join(_missing_storage_members(storage)) or "a member"
        raise ConfigError(f"storage must implement vcasync.Storage (or be None), got a "
                          f"{type(storage).__name__}, which lacks {lacks}")
    if config is not None and not isinstance(config, CoordinatorConfig):
        raise ConfigError(f"config must be a CoordinatorConfig, got {type(config).__name__}")
    if not callable(clock):
        raise ConfigError(f"clock must be a callable returning seconds, got {type(clock).__name__}")
    return listed


def check_initial_state(policy: MergePolicy, model: ModelState) -> None:
    """A :class:`ConfigError` naming the policy when the state its ``init_state(model)`` returns is
    no dict, or cannot be stored (the first snapshot holds it): found when the Coordinator is built,
    before anything is stored, instead of as a ``TypeError`` from the snapshot writer after the run
    record was written. The state made here is dropped; the run makes its own."""
    name = getattr(policy, "name", type(policy).__name__)
    try:
        state = policy.init_state(model)
    except VCAsyncError:
        raise
    except Exception as exc:
        raise ConfigError(f"policy {name!r}: init_state(model) raised {type(exc).__name__}: "
                          f"{exc}") from exc
    if not isinstance(state, dict):
        raise ConfigError(f"policy {name!r}: init_state(model) returned a {type(state).__name__}; "
                          "a policy's state is a dict of plain data and tensors")
    try:
        pack_tree(dict(state))
    except (TypeError, ValueError, VCAsyncError) as exc:
        raise ConfigError(f"policy {name!r}: the state init_state(model) returns cannot be stored "
                          f"({exc}); a policy's state holds only tensors, ints, floats, bools, "
                          "strings, None, and lists, tuples and str-keyed dicts of those (see "
                          "'Serialisable state' in docs/policies.md)") from exc
