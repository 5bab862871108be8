"""Pluggable training signals for the simulator: what a simulated worker's local training computes.

A signal owns a data set and a model, trains a copy of the global model on index batches (real
SGD, so merge policies see real updates) and evaluates a model on held-out data:

* ``surrogate``: multinomial logistic regression on a fixed synthetic Gaussian mixture (64 features,
  10 overlapping classes, so accuracy saturates near 0.72 rather than 1). Its gradient is written out
  in numpy, cheap enough for fleets of thousands of workers.
* ``digits`` / ``mnist5000`` / ``tinylm``: the example workloads (:mod:`vcasync.examples.workloads`:
  the small CNN on real images, a small transformer on the standard library's source), the very
  model, data, optimiser and evaluation the demo's real processes train, for fidelity. They are
  scored on their ``test`` split, or on ``validation`` when choosing learning rates.

The *virtual* time a unit takes is not the CPU time spent here: it is the machine model's
(``sample_cost_s`` per sample on a reference machine, divided by the machine's speed).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
from torch import nn

from ..errors import ConfigError
from ..examples.cnn import Dataset, Evaluation, evaluate, train_batches
from ..examples.workloads import WORKLOADS, Metric, Workload, get_workload
from ..tensors import ModelState

__all__ = ["SIGNALS", "LocalTraining", "TrainingSignal", "WorkloadSignal", "make_signal", "synthetic_mixture"]


@dataclass(frozen=True, slots=True)
class SignalDefaults:
    """Per-signal training defaults (each overridable on the command line)."""

    lr: float
    batch_size: int
    sample_cost_s: float


class TrainingSignal:
    """A model and its data; ``train`` runs real SGD on a copy, ``evaluate`` scores a model."""

    #: what a run on this signal is judged by (its target, time to target and gap): a language
    #: model by validation loss, a classifier by accuracy
    metric: Metric = "accuracy"

    def __init__(self, name: str, data: Dataset, make_model: Callable[[], nn.Module],
                 defaults: SignalDefaults) -> None:
        self.name = name
        self.data = data
        self.defaults = defaults
        self._make_model = make_model
        self._module = make_model()  # scratch module for evaluation

    @property
    def num_train(self) -> int:
        return self.data.num_train

    def initial_model(self, seed: int) -> ModelState:
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            module = self._make_model()
        return ModelState.from_module(module)

    def session(self, tensors: Mapping[str, torch.Tensor], *, lr: float,
                momentum: float = 0.9) -> LocalTraining:
        """A training run starting from a copy of ``tensors``, optimiser state kept across ``run`` calls."""
        module = self._make_model()
        module.load_state_dict(dict(tensors))
        return _ModuleTraining(module, self.data, lr, momentum)

    def train(self, tensors: Mapping[str, torch.Tensor], batches: Sequence[np.ndarray], *, lr: float,
              momentum: float = 0.9, steps_limit: int | None = None) -> tuple[dict[str, torch.Tensor], int]:
        """Train a copy of ``tensors`` on ``batches`` (at most ``steps_limit``); new weights and steps."""
        run = self.session(tensors, lr=lr, momentum=momentum)
        todo = batches if steps_limit is None else batches[:max(0, steps_limit)]
        steps = run.run(todo)
        return run.weights(), steps

    def evaluate(self, tensors: Mapping[str, torch.Tensor]) -> Evaluation:
        self._module.load_state_dict(dict(tensors))
        return evaluate(self._module, self.data)


def synthetic_mixture(*, features: int = 64, classes: int = 10, n_train: int = 32768, n_test: int = 4096,
                      separation: float = 0.3, seed: int = 7) -> Dataset:
    """A fixed Gaussian-mixture classification task (the same for every run: seed 7)."""
    rng = np.random.default_rng(seed)
    means = rng.normal(0.0, separation, size=(classes, features)).astype(np.float32)

    def draw(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        y = rng.integers(0, classes, size=n)
        x = means[y] + rng.normal(0.0, 1.0, size=(n, features)).astype(np.float32)
        return torch.from_numpy(x.astype(np.float32)), torch.from_numpy(y.astype(np.int64))

    x_tr, y_tr = draw(n_train)
    x_te, y_te = draw(n_test)
    return Dataset("surrogate", x_tr, y_tr, x_te, y_te, classes)


class LocalTraining(Protocol):
    """One worker's (or the synchronous baseline's) training run: SGD state lives across ``run`` calls."""

    def run(self, batches: Sequence[np.ndarray]) -> int: ...

    def weights(self) -> dict[str, torch.Tensor]: ...


class _ModuleTraining:
    def __init__(self, module: nn.Module, data: Dataset, lr: float, momentum: float) -> None:
        self._module = module
        self._data = data
        self._opt = torch.optim.SGD(module.parameters(), lr=lr, momentum=momentum)

    def run(self, batches: Sequence[np.ndarray]) -> int:
        return train_batches(self._module, self._data, batches, optimizer=self._opt)

    def weights(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self._module.state_dict().items()}


class _SoftmaxTraining:
    """Softmax regression with the gradient written out in numpy (same maths as ``nn.Linear`` +
    cross-entropy + SGD with momentum), an order of magnitude cheaper than autograd on tiny shapes."""

    def __init__(self, tensors: Mapping[str, torch.Tensor], data: Dataset, lr: float,
                 momentum: float) -> None:
        self._w = tensors["weight"].numpy().copy()
        self._b = tensors["bias"].numpy().copy()
        self._vw = np.zeros_like(self._w)
        self._vb = np.zeros_like(self._b)
        self._x = data.x_train.numpy()
        self._y = data.y_train.numpy()
        self._lr = np.float32(lr)
        self._mu = np.float32(momentum)

    def run(self, batches: Sequence[np.ndarray]) -> int:
        w, b, vw, vb, lr, mu = self._w, self._b, self._vw, self._vb, self._lr, self._mu
        for ix in batches:
            xb = self._x[ix]
            logits = xb @ w.T + b
            logits -= logits.max(axis=1, keepdims=True)
            p = np.exp(logits)
            p /= p.sum(axis=1, keepdims=True)
            p[np.arange(len(ix)), self._y[ix]] -= 1.0
            p /= np.float32(len(ix))
            vw *= mu
            vw += p.T @ xb
            vb *= mu
            vb += p.sum(axis=0)
            w -= lr * vw
            b -= lr * vb
        return len(batches)

    def weights(self) -> dict[str, torch.Tensor]:
        return {"weight": torch.from_numpy(self._w.copy()), "bias": torch.from_numpy(self._b.copy())}


class SurrogateSignal(TrainingSignal):
    """The surrogate: training through :class:`_SoftmaxTraining` (~25 us a step, no autograd),
    which is what lets a thousand simulated workers train for real in seconds."""

    def session(self, tensors: Mapping[str, torch.Tensor], *, lr: float,
                momentum: float = 0.9) -> LocalTraining:
        return _SoftmaxTraining(tensors, self.data, lr, momentum)


def _surrogate() -> TrainingSignal:
    data = synthetic_mixture()
    feats = int(data.x_train.shape[1])
    return SurrogateSignal("surrogate", data, lambda: nn.Linear(feats, data.classes),
                           SignalDefaults(lr=0.003, batch_size=32, sample_cost_s=1.0))


class _WorkloadTraining:
    def __init__(self, module: nn.Module, work: Workload, lr: float, momentum: float) -> None:
        self._module = module
        self._work = work
        self._opt = work.optimizer(module.parameters(), lr, momentum)

    def run(self, batches: Sequence[np.ndarray]) -> int:
        return self._work.train_steps(self._module, self._opt, batches)

    def weights(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self._module.state_dict().items()}


class WorkloadSignal(TrainingSignal):
    """An example workload (:mod:`vcasync.examples.workloads`), scored on ``split``."""

    def __init__(self, work: Workload, split: str = "test") -> None:
        self.name = work.name
        self.work = work
        self.metric = work.metric
        self.split = split
        self.defaults = SignalDefaults(lr=work.lr, batch_size=work.batch_size, sample_cost_s=1.0)
        self._make_model = work.model
        self._module = work.model()

    @property
    def num_train(self) -> int:
        return self.work.num_train

    def session(self, tensors: Mapping[str, torch.Tensor], *, lr: float,
                momentum: float = 0.9) -> LocalTraining:
        module = self._make_model()
        module.load_state_dict(dict(tensors))
        return _WorkloadTraining(module, self.work, lr, momentum)

    def evaluate(self, tensors: Mapping[str, torch.Tensor]) -> Evaluation:
        self._module.load_state_dict(dict(tensors))
        return self.work.evaluate(self._module, self.split)


#: Signals by name (``split``: what a workload is scored on); each builder loads its data once.
def _workload(name: str) -> Callable[[str], TrainingSignal]:
    def build(split: str) -> TrainingSignal:
        return WorkloadSignal(get_workload(name), split)
    return build


SIGNALS: Mapping[str, Callable[[str], TrainingSignal]] = {
    "surrogate": lambda split: _surrogate(),
    **{name: _workload(name) for name in WORKLOADS},
}


def make_signal(name: str, split: str = "test") -> TrainingSignal:
    builder = SIGNALS.get(name)
    if builder is None:
        raise ConfigError(f"unknown training signal {name!r}; choose one of {sorted(SIGNALS)}")
    return builder(split)
