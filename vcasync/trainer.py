"""What a user's trainer sees (:class:`TrainContext`) and returns (:class:`TrainResult`).

A trainer is ``def train(ctx: TrainContext) -> TrainResult`` (run in a worker thread so the event
loop keeps heartbeating) or ``async def train(ctx) -> TrainResult`` (awaited on the loop: it must
yield often). It trains ``ctx.unit.steps`` local steps on shard ``ctx.unit.shard`` of
``ctx.unit.num_shards`` starting from ``ctx.model``, and checks ``ctx.should_stop`` between steps::

    def train(ctx):
        net = make_net(); ctx.model.load_into(net)
        start = 0
        if (ck := ctx.load_checkpoint()) is not None:        # resuming after a preemption
            net.load_state_dict(ck["model"]); start = int(ck["step"])
        for step in range(start, ctx.unit.steps):
            if ctx.should_stop:                               # SIGTERM: save and return early
                ctx.save_checkpoint({"model": net.state_dict(), "step": step})
                return ctx.result(net, steps=step)
            ...one optimisation step...
            ctx.report_progress(step + 1)
        return ctx.result(net, steps=ctx.unit.steps, samples=...)
"""

from __future__ import annotations

import logging
import operator
import os
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .errors import ConfigError
from .ledger._units import WorkUnit
from .tensors import ModelState

__all__ = ["TrainContext", "TrainResult", "Trainer"]

log = logging.getLogger("vcasync.worker")


@dataclass(frozen=True, slots=True)
class TrainResult:
    """Trained weights (the full state dict, same names as the model) and what they cost."""

    tensors: Mapping[str, torch.Tensor]
    steps: int
    samples: int = 0
    metrics: Mapping[str, float] = field(default_factory=dict)


Trainer = Callable[["TrainContext"], "TrainResult | Awaitable[TrainResult]"]


class TrainContext:
    """One unit of work as the trainer sees it. Thread-safe where the docstrings say so."""

    def __init__(self, *, unit: WorkUnit, lease_id: str, base_version: int, model: ModelState,
                 checkpoint_path: Path, resumed: bool, stop: threading.Event,
                 on_checkpoint: Callable[[], None] | None = None) -> None:
        self.unit = unit
        self.lease_id = lease_id
        self.base_version = base_version
        #: The base model, a private copy: load it into a module with ``ctx.model.load_into(net)``.
        self.model = model
        self.resumed = resumed
        self._checkpoint_path = checkpoint_path
        self._on_checkpoint = on_checkpoint
        self._stop = stop
        self._lock = threading.Lock()
        self._steps_done = 0
        self._samples_done = 0
        self._reported = False
        self._steps_given = False
        self._metrics: dict[str, float] = {}

    def __repr__(self) -> str:
        return (f"TrainContext(unit={self.unit.unit_id!r}, shard={self.unit.shard}/{self.unit.num_shards}, "
                f"steps={self.unit.steps}, base_version={self.base_version}, resumed={self.resumed})")

    # -- stop ------------------------------------------------------------------------------------
    @property
    def should_stop(self) -> bool:
        """True once the worker is being preempted or lost the lease: save and return soon."""
        return self._stop.is_set()

    @property
    def stop_event(self) -> threading.Event:
        """The stop flag as an event (``wait(timeout)`` sleeps that wake up on preemption)."""
        return self._stop

    # -- progress ----------------------------------------------------------------------------------
    def report_progress(self, steps_done: int, samples_done: int | None = None,
                        **metrics: float) -> None:
        """Record progress; the worker's heartbeats carry it to the coordinator. Thread-safe, cheap.

        ``steps_done`` counts this unit's steps done, ``step + 1`` after the step at index ``step``:
        an integer (a numpy or torch integer scalar too) from 0 to ``unit.steps``, never less than
        the last one reported for this unit; so is ``samples_done`` (with no upper bound). Anything
        else is refused at once, naming the argument: a ``TypeError`` for what is not an integer (a
        bool, a float, a string), a ``ValueError`` for a negative count, one that goes back, or
        steps beyond the unit (the coordinator refuses such heartbeats, and the result after the
        whole unit). Nothing is recorded then."""
        steps = _count("steps_done", steps_done)
        samples = None if samples_done is None else _count("samples_done", samples_done)
        if steps > self.unit.steps:
            # e.g. a global step, or a remainder unit's step counted from its parent's first:
            # every heartbeat was refused ("steps_done must be an int in [0, 3]") while the unit
            # trained on, and then its result, for claiming more steps than the unit has
            offset = self.unit.params.get("step_offset")
            hint = (f" (params['step_offset'] = {offset} are the parent unit's steps already "
                    "merged, not this unit's)" if offset else "")
            raise ValueError(f"report_progress({steps}): unit {self.unit.unit_id} has "
                             f"{self.unit.steps} steps; count this unit's steps done, 0 to "
                             f"{self.unit.steps}{hint}")
        values = _metric_values(metrics)
        with self._lock:
            # A count that goes back is a trainer's bug (a step index reported after step + 1, a
            # counter reset): the result's steps default to the last report, so it would be
            # weighed, and the rest of the unit queued again, by the wrong count. A resumed lease
            # gets a fresh context: its reports start again from 0, whatever its checkpoint's step.
            if steps < self._steps_done:
                raise ValueError(f"report_progress: steps_done went back from {self._steps_done} to "
                                 f"{steps} in unit {self.unit.unit_id}; report this unit's steps "
                                 "done so far, which never go down")
            if samples is not None and samples < self._samples_done:
                raise ValueError(f"report_progress: samples_done went back from {self._samples_done} "
                                 f"to {samples} in unit {self.unit.unit_id}; report this unit's "
                                 "samples done so far, which never go down")
            self._reported = True
            self._steps_done = steps
            if samples is not None:
                self._samples_done = samples
            self._metrics.update(values)

    @property
    def progress_reported(self) -> bool:
        """True once the trainer has called :meth:`report_progress` for this unit."""
        with self._lock:
            return self._reported

    @property
    def steps_given(self) -> bool:
        """True once the trainer has passed ``steps=`` to :meth:`result`: it said its steps itself."""
        with self._lock:
            return self._steps_given

    @property
    def steps_done(self) -> int:
        with self._lock:
            return self._steps_done

    @property
    def samples_done(self) -> int:
        with self._lock:
            return self._samples_done

    # -- checkpoints -------------------------------------------------------------------------------
    def save_checkpoint(self, state: Mapping[str, Any]) -> None:
        """Save ``state`` (tensors, numbers, strings, nested dicts/lists) for this lease, atomically.

        A restarted worker that resumes the same lease gets it back from :meth:`load_checkpoint`;
        with a remote worker state, on whatever machine it restarts (it returns once stored there).
        Anything ``torch.load(weights_only=True)`` could not read back (a numpy array, an object) is
        refused here with a :class:`TypeError` naming its place, not found unreadable at a resume.
        """
        _check_checkpoint(state)
        tmp = self._checkpoint_path.with_name(f".{self._checkpoint_path.name}.tmp")
        torch.save(dict(state), tmp)
        os.replace(tmp, self._checkpoint_path)
        if self._on_checkpoint is not None:
            self._on_checkpoint()

    def load_checkpoint(self) -> dict[str, Any] | None:
        """The last checkpoint saved for this lease (``torch.load(weights_only=True)``), or None.

        A ``"model"`` entry that is a mapping of tensors is checked against :attr:`model`: a tensor
        of another shape, or a name the model does not have, is a checkpoint some other model wrote
        (the model changed, a state dir reused) and is refused with a
        :class:`~vcasync.errors.ConfigError` naming the tensor, both shapes and the file to remove,
        instead of torch's "size mismatch" from ``load_state_dict``. Entries named unlike the
        model's tensors altogether (another naming scheme) are left to the trainer."""
        if not self._checkpoint_path.exists():
            return None
        try:
            loaded = torch.load(self._checkpoint_path, map_location="cpu", weights_only=True)
        except Exception as exc:  # a corrupt checkpoint must not wedge the worker: start the unit over
            log.warning("checkpoint %s is unreadable (%s); starting the unit over",
                        self._checkpoint_path, exc)
            return None
        if not isinstance(loaded, dict):
            return None
        problem = _model_mismatch(loaded.get("model"), self.model)
        if problem is not None:
            raise ConfigError(
                f"the checkpoint {self._checkpoint_path} of lease {self.lease_id} was not written for "
                f"this run's model: {problem}; a model of another shape saved it (the model "
                "changed, or a --state-dir reused from another run), so the unit must start over "
                "without it: a worker drops it as it hands the lease back; otherwise remove "
                f"{self._checkpoint_path}, or start with a fresh --state-dir")
        return dict(loaded)

    # -- the result --------------------------------------------------------------------------------
    def result(self, trained: torch.nn.Module | Mapping[str, torch.Tensor], *, steps: int | None = None,
               samples: int | None = None, **metrics: float) -> TrainResult:
        """Wrap the trained module (or state dict) as a :class:`TrainResult`.

        ``steps``/``samples`` default to the last :meth:`report_progress`; metrics add to those reported.
        A trainer that never reported progress and was not asked to stop trained the whole unit, as
        its contract says: ``steps`` then defaults to ``unit.steps`` (nothing measured says 0). Asked
        to stop, its steps are unknown: 0, and the worker hands the unit back instead of weighing it.
        ``steps`` and ``samples`` given are integers as :meth:`report_progress`'s are (``TypeError``
        for ``2.7`` or ``True``, ``ValueError`` for a negative count, naming the argument).
        """
        tensors = (ModelState.from_module(trained).tensors if isinstance(trained, torch.nn.Module)
                   else {k: _result_tensor(k, v) for k, v in trained.items()})
        with self._lock:
            all_metrics = {**self._metrics, **_metric_values(metrics)}
            self._steps_given = self._steps_given or steps is not None
            if steps is None and not self._reported:
                steps = 0 if self._stop.is_set() else self.unit.steps
            return TrainResult(
                tensors=tensors,
                steps=self._steps_done if steps is None else _count("steps", steps, "ctx.result"),
                samples=self._samples_done if samples is None else _count("samples", samples, "ctx.result"),
                metrics=all_metrics)


def _result_tensor(name: object, value: object) -> torch.Tensor:
    """One value of a state dict given to :meth:`TrainContext.result`, on the CPU; what is not a
    tensor is refused with a ``TypeError`` naming it (it failed as ``AttributeError("'NoneType'
    object has no attribute 'detach'")``, which named neither the tensor nor the fix)."""
    if not isinstance(value, torch.Tensor):
        kind = type(value)
        raise TypeError(f"the trained state dict's entry {_short_repr(name)} is a "
                        f"{kind.__module__}.{kind.__qualname__}, not a torch.Tensor; every value "
                        "of the model's state dict must be a tensor (a numpy array: "
                        "torch.from_numpy(a))")
    return value.detach().cpu()


def _model_mismatch(saved: object, model: ModelState) -> str | None:
    """What makes a checkpoint's ``"model"`` entry unfit for ``model``, or None: the first tensor
    of another shape, then names the model does not have. Not a mapping of tensors, or no name in
    common with the model (a trainer's own naming), it is not checked. Dtypes are not compared
    (``load_state_dict`` casts), only named beside the shapes."""
    if not isinstance(saved, Mapping) or not saved or not all(
            isinstance(v, torch.Tensor) for v in saved.values()):
        return None
    if not any(name in model for name in saved):
        return None
    for name, tensor in saved.items():
        want = model.get(name)
        if want is not None and tensor.shape != want.shape:
            return (f"tensor {name!r} is {_tensor_kind(tensor)} in the checkpoint, the model's is "
                    f"{_tensor_kind(want)}")
    extra = [name for name in saved if name not in model]
    if extra:
        shown = ", ".join(_short_repr(n) for n in extra[:5])
        more = f" and {len(extra) - 5} more" if len(extra) > 5 else ""
        return f"its model holds {len(extra)} tensor(s) the model does not have: {shown}{more}"
    return None


def _tensor_kind(tensor: torch.Tensor) -> str:
    """``shape (3, 4) float32``: a tensor's shape and dtype as the messages name them."""
    return f"shape {tuple(tensor.shape)} {str(tensor.dtype).removeprefix('torch.')}"


def _metric_values(metrics: Mapping[str, Any]) -> dict[str, float]:
    """``metrics`` as floats; a value that is not a number is refused, naming the metric."""
    out: dict[str, float] = {}
    for name, value in metrics.items():
        try:
            out[name] = float(value)
        except (TypeError, ValueError, RuntimeError):   # RuntimeError: a tensor of several elements
            raise TypeError(f"metric {name!r} = {_short_repr(value)} is not a number") from None
    return out


#: The largest step or sample count a trainer may report: what a result's meta can carry.
MAX_COUNT = 2**63 - 1


def _count(name: str, value: object, where: str = "report_progress") -> int:
    """``value`` as a count (an int, or a numpy or torch integer scalar: ``operator.index``); a
    bool, a float, a string is refused with a ``TypeError``, a negative count with a ``ValueError``,
    naming the argument and ``where`` it was given (``int()`` once made ``1.5`` one step, ``"2"``
    two, ``True`` one, ``-5`` none)."""
    what = name.removesuffix("_done")
    is_bool = isinstance(value, (bool, np.bool_)) or (
        isinstance(value, torch.Tensor) and value.dtype == torch.bool)
    try:
        if is_bool:
            raise TypeError
        count = operator.index(value)   # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"{where}: {name} = {_short_repr(value)} is not an integer; "
                        f"it counts this unit's {what} done") from None
    if count < 0:
        raise ValueError(f"{where}: {name} = {count} is negative; it counts this unit's "
                         f"{what} done, from 0")
    if count > MAX_COUNT:     # a result's meta (msgpack) carries 64-bit ints: the upload crashed
        raise ValueError(f"{where}: {name} = {_short_repr(count)} is more than a result can carry "
                         f"(at most 2**63 - 1); it counts this unit's {what} done")
    return count


def _short_repr(value: object, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({type(value).__name__})"


# What ``torch.load(weights_only=True)`` reads back on every supported torch (>= 2.2): exact types,
# so a dict or tuple subclass (defaultdict, a namedtuple), a numpy scalar or an IntEnum is refused.
_CHECKPOINT_LEAVES: frozenset[type] = frozenset({
    torch.Tensor, torch.nn.Parameter, str, int, float, bool, type(None), torch.Size, torch.dtype})
_CHECKPOINT_SEQUENCES: frozenset[type] = frozenset({list, tuple})
_CHECKPOINT_MAPPINGS: frozenset[type] = frozenset({dict, OrderedDict})


def _check_checkpoint(state: Mapping[str, Any]) -> None:
    """Refuse what a ``weights_only`` load cannot read back, naming where it sits in ``state``."""
    stack: list[tuple[str, object]] = [(f"[{k!r}]", v) for k, v in state.items()]
    stack.extend((f" key {k!r}", k) for k in state)
    seen: set[int] = set()
    while stack:
        where, value = stack.pop()
        kind = type(value)
        if kind in _CHECKPOINT_LEAVES:
            continue
        if kind not in _CHECKPOINT_SEQUENCES and kind not in _CHECKPOINT_MAPPINGS:
            raise TypeError(
                f"checkpoint value state{where} is a {kind.__module__}.{kind.__qualname__}, which "
                "torch.load(weights_only=True) cannot read back on resume; a checkpoint holds only "
                "tensors, str, int, float, bool, None, torch dtypes and sizes, and lists, tuples and "
                "dicts of them: convert it (a numpy array: torch.from_numpy(a); an RNG state: see "
                "'Checkpoints' in docs/trainer.md)")
        if id(value) in seen:
            continue
        seen.add(id(value))
        if kind in _CHECKPOINT_MAPPINGS:
            assert isinstance(value, dict)
            stack.extend((f"{where}[{k!r}]", v) for k, v in value.items())
            stack.extend((f"{where} key {k!r}", k) for k in value)
        else:
            assert isinstance(value, (list, tuple))
            stack.extend((f"{where}[{i}]", v) for i, v in enumerate(value))
