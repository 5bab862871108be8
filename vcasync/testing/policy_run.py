"""Feed a policy a stream of results the way the coordinator does, checking the contract as it goes.

:class:`PolicyRun` keeps what the coordinator keeps for a policy: the model, the policy state, the
version counter and every past version (so a delta's ``base`` can be filled in). The run starts at
the model's own version, so a model drawn at version 10**9 lets a result be 10**9 versions stale;
versions before the start are taken to equal the starting model. Each :meth:`PolicyRun.feed` turns
a :class:`~vcasync.testing.strategies.StreamItem` into an ``Update`` (``base_version = version -
lag``, ``staleness``, for a delta ``base`` when the policy ``needs_base``, and for full weights the
integer tensors as increments over the base, as the coordinator does), merges it, and checks the
rules of :mod:`vcasync.policy`:

- ``init_state`` leaves the model as it was (it reads it; only ``merge`` and ``flush`` change it);
- returning None leaves the model bit-for-bit as it was;
- a refusal (:class:`~vcasync.errors.UpdateRejectedError`) leaves model and state as they were;
- a merged model keeps the names, shapes and dtypes;
- the update's tensors, its base and its metadata (kind, versions, staleness, samples, steps,
  worker, unit, metrics) are never changed;
- the state stays serialisable by :func:`vcasync.wire.pack_tree`, and its tensors change only
  through torch operations on them (PyTorch counts those; a change through ``.data`` or a NumPy
  view it does not, and the coordinator goes by that count);
- ``merge`` raises nothing but :class:`~vcasync.errors.UpdateRejectedError`.

Any breach raises :class:`LawViolation` (an ``AssertionError``, so test runners report it as a
failure) that names the law, the policy, the step and the tensor.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch

from ..errors import UpdateRejectedError
from ..policy import MergePolicy, PolicyState
from ..tensors import ModelSpec, ModelState, Update, counter_increments, tensor_bytes
from ..wire import pack_tree, unpack_tree
from .strategies import StreamItem

__all__ = [
    "LawViolation",
    "PolicyFactory",
    "PolicyRun",
    "Step",
    "bits_equal",
    "compare_runs",
    "pack_state",
    "roundtrip_state",
    "values_equal",
]

#: Anything that builds a fresh policy: a class, ``functools.partial(build_policy, name, params)``,
#: a lambda.
PolicyFactory = Callable[[], MergePolicy]

Outcome = Literal["merged", "kept", "rejected", "flushed"]


class LawViolation(AssertionError):
    """A policy broke a law; ``law`` names it."""

    def __init__(self, law: str, message: str) -> None:
        super().__init__(f"[{law}] {message}")
        self.law = law


def pack_state(state: PolicyState) -> bytes:
    """The serialised state (:func:`vcasync.wire.pack_tree`); the one place the format is chosen."""
    return pack_tree(state)


def roundtrip_state(state: PolicyState) -> PolicyState:
    """``state`` through the wire and back, as a coordinator checkpoint would carry it."""
    restored = unpack_tree(pack_state(state))
    if not isinstance(restored, dict):
        raise LawViolation("state_roundtrip", f"state came back as {type(restored).__name__}")
    return restored


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same dtype, shape and bytes (NaN payloads and signed zeros included; strides are not)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return bytes(tensor_bytes(a)) == bytes(tensor_bytes(b))


def values_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same dtype, shape and values, element by element: a NaN equals a NaN whatever its bits
    (torch's kernels give a NaN another payload, or sign, depending on the memory layout they
    run over), and strides are not compared."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return not bool(_value_differences(a, b).any())


def _flat_values(t: torch.Tensor) -> torch.Tensor:
    """``t``'s elements in logical order, one row per element (complex: real and imaginary),
    floats as float64 (a dtype with no CPU comparison, the float8 family, compares too)."""
    t = t.detach().cpu().resolve_conj().resolve_neg().reshape(-1)
    if t.is_complex():
        t = torch.view_as_real(t)               # (n, 2)
    else:
        t = (t.to(torch.uint8) if t.dtype == torch.bool else t).reshape(-1, 1)
    return t.double() if t.is_floating_point() else t


def _value_differences(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """A bool per element (logical order): where the values differ, NaN equal to NaN."""
    x, y = _flat_values(a), _flat_values(b)
    differ = x != y
    if x.is_floating_point():
        differ &= ~(x.isnan() & y.isnan())
    return differ.any(1)


def _bit_differences(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """A bool per element (logical order): where the bytes differ."""
    if a.numel() == 0:
        return torch.zeros(0, dtype=torch.bool)
    x = torch.frombuffer(bytearray(tensor_bytes(a)), dtype=torch.uint8)
    y = torch.frombuffer(bytearray(tensor_bytes(b)), dtype=torch.uint8)
    return (x != y).reshape(a.numel(), a.dtype.itemsize).any(1)


def _at(shape: torch.Size, flat: int) -> tuple[int, ...]:
    """The index in a tensor of ``shape`` of its ``flat``-th element in logical order."""
    index: list[int] = []
    for side in reversed(shape):
        flat, i = divmod(flat, side)
        index.append(i)
    return tuple(reversed(index))


def _element(t: torch.Tensor, flat: int) -> str:
    """The ``flat``-th element of ``t`` (logical order): its value, and for a float its bits."""
    value = t.detach().cpu().resolve_conj().resolve_neg().reshape(-1)[flat]
    if not (t.is_floating_point() or t.is_complex()):
        return repr(value.item())
    return f"{value.item()!r} (0x{bytes(tensor_bytes(value))[::-1].hex()})"   # little-endian


def _tensor_difference(name: str, a: torch.Tensor, b: torch.Tensor, *,
                      exact: bool = True) -> str | None:
    """How ``b`` differs from ``a`` (``name`` says which tensor), or None when they are equal:
    bit for bit when ``exact`` (:func:`bits_equal`), else value for value (:func:`values_equal`).
    The description names the tensor, its dtype and shape, and how it differs: the dtype or the
    shape, a NaN where the other has a number, how many elements differ and by how much (the
    largest absolute difference), or for bits alone which bits (a NaN's payload, a zero's sign)."""
    if a.dtype != b.dtype:
        return f"tensor {name!r}: dtype {a.dtype} vs {b.dtype}"
    if a.shape != b.shape:
        return f"tensor {name!r}: {a.dtype} of shape {tuple(a.shape)} vs {tuple(b.shape)}"
    what = f"tensor {name!r} ({a.dtype}, shape {tuple(a.shape)})"
    values = _value_differences(a, b)
    if not bool(values.any()):
        if not exact:
            return None
        bits = _bit_differences(a, b)
        if not bool(bits.any()):
            return None
        i = int(bits.nonzero()[0])
        return (f"{what}: equal values, other bits at {bits.sum().item()} element(s), first at "
                f"index {_at(a.shape, i)}: {_element(a, i)} vs {_element(b, i)} (a NaN's "
                "payload or a zero's sign)")
    i = int(values.nonzero()[0])
    said = (f"{what}: {int(values.sum())} of {a.numel()} element(s) differ, first at index "
            f"{_at(a.shape, i)}: {_element(a, i)} vs {_element(b, i)}")
    if a.is_floating_point() or a.is_complex():
        x, y = _flat_values(a), _flat_values(b)
        nan_x, nan_y = x.isnan().any(1), y.isnan().any(1)
        one_nan = nan_x ^ nan_y
        if bool(one_nan.any()):
            said += f"; NaN in one only at {int(one_nan.sum())} element(s)"
        both = ~(nan_x | nan_y) & values
        if bool(both.any()):
            gap = (x[both] - y[both]).abs().max().item()
            said += f"; largest absolute difference {gap:.6g}"
    elif a.dtype != torch.bool:
        gap = (_flat_values(a) - _flat_values(b)).abs().max().item()
        said += f"; largest absolute difference {gap}"
    return said


def _first_difference(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor], *,
                      exact: bool = True) -> str | None:
    if list(a) != list(b):
        return f"names differ: {list(a)} vs {list(b)}"
    for name, t in a.items():
        diff = _tensor_difference(name, t, b[name], exact=exact)
        if diff is not None:
            return diff
    return None


def _state_difference(a: PolicyState, b: PolicyState, *, exact: bool = True) -> str | None:
    """Where two policy states differ as stored (each through :func:`vcasync.wire.pack_tree` and
    back: tensors contiguous), or None: the first differing key as a path (``state['buf']['w']``)
    and, for a tensor, how it differs (``exact`` as for :func:`_tensor_difference`). A float in the
    state compares as a tensor's element does (NaN equals NaN unless ``exact``)."""
    packed_a, packed_b = pack_state(a), pack_state(b)
    if exact and packed_a == packed_b:
        return None
    found = _tree_difference("state", unpack_tree(packed_a), unpack_tree(packed_b), exact)
    if found is None and exact:        # no element differs, but the bytes do: say so, unnamed
        return "state: the stored bytes differ, though no key or value does"
    return found


def _tree_difference(path: str, x: object, y: object, exact: bool) -> str | None:
    if type(x) is not type(y):
        return f"{path}: a {type(x).__name__} vs a {type(y).__name__}"
    if isinstance(x, torch.Tensor):
        assert isinstance(y, torch.Tensor)
        diff = _tensor_difference(path, x, y, exact=exact)
        return None if diff is None else diff.replace(f"tensor {path!r}", f"tensor {path}", 1)
    if isinstance(x, dict):
        assert isinstance(y, dict)
        if list(x) != list(y):
            missing = [k for k in x if k not in y]
            extra = [k for k in y if k not in x]
            return (f"{path}: keys differ: {list(x)} vs {list(y)}" if not (missing or extra) else
                    f"{path}: keys {missing} only in the first, {extra} only in the second")
        for k in x:
            found = _tree_difference(f"{path}[{k!r}]", x[k], y[k], exact)
            if found is not None:
                return found
        return None
    if isinstance(x, (list, tuple)):
        assert isinstance(y, (list, tuple))
        if len(x) != len(y):
            return f"{path}: {len(x)} vs {len(y)} items"
        for i, (p, q) in enumerate(zip(x, y, strict=True)):
            found = _tree_difference(f"{path}[{i}]", p, q, exact)
            if found is not None:
                return found
        return None
    if isinstance(x, float) and isinstance(y, float):
        same = (x == y or (x != x and y != y)) if not exact else \
            struct.pack("<d", x) == struct.pack("<d", y)
        return None if same else f"{path}: {x!r} vs {y!r}"
    return None if x == y else f"{path}: {x!r} vs {y!r}"


def _spec_difference(want: ModelSpec, got: ModelSpec) -> str:
    """How ``got`` differs from the model's spec ``want``: the first tensor gone, added, or of
    another dtype or shape (the coordinator refuses each), else the order of the names."""
    gone = [n for n in want if n not in got]
    if gone:
        return f"tensor {gone[0]!r} is missing ({len(gone)} of the model's {len(want)} are)"
    extra = [n for n in got if n not in want]
    if extra:
        return f"it has a tensor the model has not, {extra[0]!r} ({len(extra)} such)"
    for name, spec in want.items():
        if got[name].dtype != spec.dtype:
            return f"tensor {name!r} has dtype {got[name].dtype}, the model has {spec.dtype}"
        if got[name].shape != spec.shape:
            return f"tensor {name!r} has shape {got[name].shape}, the model has {spec.shape}"
    return f"its tensors are in another order: {list(got)} vs the model's {list(want)}"


@dataclass(frozen=True, eq=False)
class Step:
    """What one result did: ``outcome``, the refusal ``reason``, and the model afterwards (a copy)."""

    outcome: Outcome
    reason: str | None
    model: ModelState
    version: int
    #: The update as the policy was given it (integers as increments; base not kept).
    update: Update | None = None


def _state_tensors(tree: object, path: str = "state") -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor in a policy state, with its path (``state['m']['w']``)."""
    if isinstance(tree, torch.Tensor):
        yield path, tree
    elif isinstance(tree, dict):
        for key, value in tree.items():
            yield from _state_tensors(value, f"{path}[{key!r}]")
    elif isinstance(tree, (list, tuple)):
        for i, value in enumerate(tree):
            yield from _state_tensors(value, f"{path}[{i}]")


def _counted(state: PolicyState) -> list[tuple[str, torch.Tensor, int, torch.Tensor]]:
    """Each state tensor with its path, PyTorch's count of its in-place changes, and a copy."""
    out = []
    for path, t in _state_tensors(state):
        try:
            version = int(t._version)
        except RuntimeError:                     # an inference-mode tensor counts nothing
            continue
        out.append((path, t, version, t.detach().clone()))
    return out


def _uncounted_change(counted: list[tuple[str, torch.Tensor, int, torch.Tensor]],
                      state: PolicyState, label: str) -> None:
    """A :class:`LawViolation` (``contract``) when a tensor still in ``state`` changed while its
    count of in-place changes did not: the coordinator takes the state before each merge, to put
    it back if the merge fails, copying only the tensors whose count moved, so a change made
    through ``.data`` or a NumPy view would be restored from a stale copy."""
    present = {id(t) for _, t in _state_tensors(state)}
    for path, t, version, before in counted:
        if id(t) in present and int(t._version) == version and not bits_equal(t, before):
            diff = str(_tensor_difference(path, before, t)).replace(f"tensor {path!r}", "it", 1)
            raise LawViolation("contract", f"{label} changed {path} without PyTorch counting the "
                                           f"change ({diff}): through .data or a NumPy view? Change "
                                           "state tensors with torch operations on the tensors "
                                           "themselves: the coordinator finds what a merge changed "
                                           "by their count of in-place changes")


def _metadata(update: Update) -> tuple[object, ...]:
    """Everything about an update but its tensors: what a merge must leave as it found it."""
    return (update.kind, update.base_version, update.staleness, update.samples, update.steps,
            update.worker_id, update.unit_id, sorted(update.metrics.items()), id(update.base),
            list(update.tensors), [id(t) for t in update.tensors.values()])


def policy_label(policy: object) -> str:
    """How a law names ``policy``: its ``repr`` when its class gives one (the built-ins'
    ``SyncAverage(buffer_size=4)``), else its class and ``name`` (a plugin's policy without a
    ``__repr__`` was named ``<mod.Damped object at 0x7f...>``)."""
    if type(policy).__repr__ is not object.__repr__:
        return repr(policy)
    name = getattr(policy, "name", None)
    return type(policy).__name__ + (f" (name {name!r})" if isinstance(name, str) else "")


class PolicyRun:
    """A policy, its state and the model, fed results one at a time like the coordinator does."""

    def __init__(self, policy: MergePolicy, model: ModelState, *, state: PolicyState | None = None,
                 history: list[ModelState] | None = None, check: bool = True) -> None:
        self.policy = policy
        self.model = model
        before = model.clone() if check and state is None else None
        self.state: PolicyState = policy.init_state(model) if state is None else state
        if before is not None:
            # the coordinator calls init_state on the model it serves as version 0 (and again on
            # the model of the moment when --reset-policy switches policies): it only reads it
            self._same(before, model, "contract",
                       f"{policy_label(policy)}: init_state(model) changed the model")
        if not isinstance(self.state, dict):
            # as the coordinator refuses it (a ConfigError naming the policy); this was reported
            # later as "[state_roundtrip] state came back as NoneType", which the policy never did
            raise LawViolation("contract", f"{policy_label(policy)}: init_state(model) returned a "
                                           f"{type(self.state).__name__}; a policy's state is a dict "
                                           "with str keys (of tensors and plain data), {} for none")
        self.history: list[ModelState] = history if history is not None else [model.clone()]
        self.start = self.history[0].version
        self.check = check
        self.steps: list[Step] = []

    @property
    def version(self) -> int:
        return self.start + len(self.history) - 1

    def base_version(self, lag: int) -> int:
        """The version a result ``lag`` versions behind the current one was based on."""
        return max(0, self.version - lag)

    def model_at(self, version: int) -> ModelState:
        """The model at ``version`` (versions before the run's start equal its first model)."""
        return self.history[max(0, version - self.start)]

    def fork(self, policy: MergePolicy, state: PolicyState) -> PolicyRun:
        """A copy of this run (model and history cloned) driven by ``policy`` with ``state``."""
        return PolicyRun(policy, self.model.clone(), state=state,
                         history=[m.clone() for m in self.history], check=self.check)

    def feed_all(self, items: Iterable[StreamItem]) -> list[Step]:
        return [self.feed(item) for item in items]

    def feed(self, item: StreamItem, *, staleness: int | None = None) -> Step:
        """Merge one result; ``staleness`` overrides the one implied by the lag (same base)."""
        base_version = self.base_version(item.lag)
        tau = self.version - base_version if staleness is None else staleness
        # Like the coordinator: the base travels with a delta, when the policy needs it, and a
        # full-weights result's counters arrive as increments over its base version.
        base = self.model_at(base_version) if self.policy.needs_base and item.kind == "delta" else None
        update = item.to_update(base_version, tau, base)
        if item.kind == "weights":
            update.tensors = counter_increments(item.tensors, self.model_at(base_version))
        label = f"{policy_label(self.policy)}, step {len(self.steps)}"
        if self.check:
            before_model = self.model.clone()
            before_state = self._packed(label)
            counted = _counted(self.state)
            inputs = {n: t.clone() for n, t in update.tensors.items()}
            base_copy = base.clone() if base is not None else None
            meta = _metadata(update)
        try:
            out = self.policy.merge(self.model, update, self.state)
        except UpdateRejectedError as exc:
            if self.check:
                self._same(before_model, self.model, "contract", f"{label}: a refusal changed the model")
                if self._packed(label) != before_state:
                    raise LawViolation("contract", f"{label}: a refusal changed the state") from exc
                self._inputs(update, inputs, base, base_copy, meta, label)
            step = Step("rejected", exc.reason, self.model.clone(), self.version, update)
            self.steps.append(step)
            return step
        except Exception as exc:
            hint = (" (the policy says needs_base=False, so a delta comes with update.base None)"
                    if item.kind == "delta" and base is None else "")
            raise LawViolation("contract", f"{label}: merge raised {type(exc).__name__}: {exc}{hint}; "
                                           f"a policy refuses a result only with UpdateRejectedError"
                               ) from exc
        if self.check:
            self._inputs(update, inputs, base, base_copy, meta, label)
            self._packed(label)
            _uncounted_change(counted, self.state, f"{label}: merge")
        return self._record(out, before_model if self.check else None, label, "merge", update)

    def _record(self, out: Any, before_model: ModelState | None, label: str, method: str,
                update: Update | None = None) -> Step:
        """The step a merge's or flush's return makes (``method`` names which), checked as the
        contract says: None keeps the model (unchanged when ``before_model`` is given), else a
        ModelState of the same spec becomes the next version."""
        done: Outcome = "merged" if method == "merge" else "flushed"
        if out is None:
            if before_model is not None:
                self._same(before_model, self.model, "contract",
                           f"{label}: {method} returned None but changed the model")
            step = Step("kept", None, self.model.clone(), self.version, update)
        else:
            if not isinstance(out, ModelState):
                raise LawViolation("contract", f"{label}: {method} returned {type(out).__name__}, "
                                               f"not a ModelState or None")
            want = self.history[0].spec
            if out.spec != want:
                raise LawViolation("contract", f"{label}: the {done} model's spec changed: "
                                               f"{_spec_difference(want, out.spec)}")
            self.model = out
            self.model.version = self.version + 1
            self.history.append(out.clone())
            step = Step(done, None, out.clone(), self.version, update)
        self.steps.append(step)
        return step

    def flush(self) -> Step | None:
        """The end of the run, as the coordinator ends it: the policy's ``flush`` (None when it
        has none), checked like a merge (None keeps the model, the spec holds, the state
        serialises), and asked a second time, which must apply nothing (a flush is never applied
        twice). The step's outcome is ``"flushed"`` or ``"kept"``."""
        flush = getattr(self.policy, "flush", None)
        if flush is None:
            return None
        label = f"{policy_label(self.policy)}, flush after step {len(self.steps) - 1}"
        step = self._flush_once(flush, label)
        again = self._flush_once(flush, f"{label}, asked again")
        if again.outcome != "kept":
            raise LawViolation("contract", f"{label}: a second flush changed the model again; a "
                                           "flush applies what the policy holds and empties it")
        self.steps.pop()                 # the second one is a check, not a step of the run
        return step

    def _flush_once(self, flush: Any, label: str) -> Step:
        before_model = self.model.clone() if self.check else None
        counted = _counted(self.state) if self.check else []
        try:
            out = flush(self.model, self.state)
        except Exception as exc:
            raise LawViolation("contract", f"{label}: flush raised {type(exc).__name__}: {exc}; "
                                           "a flush applies what the policy holds, or returns None"
                               ) from exc
        self._packed(label)
        _uncounted_change(counted, self.state, f"{label}: flush")
        return self._record(out, before_model, label, "flush")

    def _packed(self, label: str) -> bytes:
        try:
            return pack_state(self.state)
        except Exception as exc:  # whatever pack_tree refuses, the policy is at fault
            raise LawViolation("state_roundtrip", f"{label}: the state does not serialise with "
                                                  f"vcasync.wire.pack_tree: {exc}") from exc

    @staticmethod
    def _same(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor], law: str, msg: str) -> None:
        diff = _first_difference(a, b)
        if diff is not None:
            raise LawViolation(law, f"{msg} ({diff})")

    def _inputs(self, update: Update, inputs: dict[str, torch.Tensor], base: ModelState | None,
                base_copy: ModelState | None, meta: tuple[object, ...], label: str) -> None:
        after = _metadata(update)
        if after != meta:
            fields = ("kind", "base_version", "staleness", "samples", "steps", "worker_id",
                      "unit_id", "metrics", "base (the object)", "tensor names",
                      "tensors (the objects)")
            changed = [f for f, a, b in zip(fields, meta, after, strict=True) if a != b]
            raise LawViolation("inputs_unchanged", f"{label}: merge changed the update's "
                                                   f"{', '.join(changed)}")
        self._same(inputs, update.tensors, "inputs_unchanged", f"{label}: merge mutated update.tensors")
        if base is not None and base_copy is not None:
            self._same(base_copy, base, "inputs_unchanged", f"{label}: merge mutated update.base")
            if base.version != base_copy.version:
                raise LawViolation("inputs_unchanged", f"{label}: merge changed update.base.version")


def compare_runs(a: PolicyRun, b: PolicyRun, law: str, what: str, *, skip_a: int = 0,
                 exact: bool = True) -> None:
    """Raise :class:`LawViolation` unless both runs took the same steps with the same models and
    end with the same state: the same bits when ``exact``, else the same values (NaN equal to NaN
    whatever its bits: :func:`values_equal`). The message names the step, the first model tensor
    or state key that differs, its dtype and shape, and how it differs (a NaN where the other has
    a number, how many elements differ and the largest absolute difference, or which bits).

    ``skip_a`` ignores ``a``'s first steps (``b`` was forked from ``a`` after them).
    """
    steps_a = a.steps[skip_a:]
    if len(steps_a) != len(b.steps):
        raise LawViolation(law, f"{what}: {len(steps_a)} vs {len(b.steps)} steps")
    for i, (x, y) in enumerate(zip(steps_a, b.steps, strict=True)):
        if (x.outcome, x.reason) != (y.outcome, y.reason):
            raise LawViolation(law, f"{what}: step {i + skip_a} was {x.outcome}/{x.reason} vs "
                                    f"{y.outcome}/{y.reason}")
        diff = _first_difference(x.model, y.model, exact=exact)
        if diff is not None:
            raise LawViolation(law, f"{what}: step {i + skip_a} models differ ({diff})")
    diff = _state_difference(a.state, b.state, exact=exact)
    if diff is not None:
        raise LawViolation(law, f"{what}: the final states differ ({diff})")
