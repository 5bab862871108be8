"""A small CNN on scikit-learn's handwritten digits (1,797 8x8 images, shipped inside scikit-learn).

Three functions make a complete vcasync job::

    vcasync coordinator --model vcasync.examples.digits:model ...
    vcasync worker --trainer vcasync.examples.digits:train ...
    accuracy = evaluate(model_state)

The model and the data are the demo's (:mod:`vcasync.examples.cnn`: one definition of the small CNN and
one deterministic, stratified split of 1,437 training and 360 test images, standardised), so this
example, ``vcasync demo`` and the simulator train the same network and score it on the same 360
images. This example trains on all 1,437; the demo's workload (:mod:`vcasync.examples.workloads`)
holds 144 of them out as a validation split, on which its learning-rate search chooses, and
trains on the other 1,293. A unit trains on shard
``unit.shard`` of ``unit.num_shards`` of the training set; its mini-batches are drawn from a seed derived
from the unit, so a unit resumed after a preemption (or its remainder, ``params["step_offset"]``)
continues the same sequence. Unit ``params`` may set ``lr`` (0.05), ``batch_size`` (32),
``momentum`` (0.9) and ``checkpoint_every`` (10 steps).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from functools import lru_cache

import torch
from torch import nn

# absolute imports, not relative ones: a user copies this file as a module of their own
from vcasync.examples.cnn import SmallCNN, load_dataset
from vcasync.tensors import ModelState
from vcasync.trainer import TrainContext, TrainResult

__all__ = ["evaluate", "load_split", "model", "train"]


def model() -> nn.Module:
    """The demo's small CNN for 1x8x8 inputs, 10 classes (about 39k parameters)."""
    return SmallCNN(8, 10)


@lru_cache(maxsize=2)
def load_split(split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(images [N,1,8,8] float32 standardised, labels [N] int64)`` for ``"train"`` or ``"test"``."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    data = load_dataset("digits")
    if split == "train":
        return data.x_train, data.y_train
    return data.x_test, data.y_test


def _unit_seed(unit_id: str) -> int:
    root = unit_id.split("~", 1)[0]  # a remainder unit continues its parent's sequence
    return int.from_bytes(hashlib.blake2b(root.encode(), digest_size=8).digest(), "little") & (2**62 - 1)


def _num(params: Mapping[str, object], name: str, default: float) -> float:
    value = params.get(name, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"unit param {name!r} must be a number, got {value!r}")
    return float(value)


def train(ctx: TrainContext) -> TrainResult:
    """Train ``ctx.unit.steps`` SGD steps on this unit's shard; checkpoint, stop early when told."""
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
    loss_fn = nn.CrossEntropyLoss()
    # Draw (and discard) the batches of the steps already done so the sequence continues exactly.
    for _ in range(offset + start):
        torch.randint(len(y), (batch,), generator=gen)
    # the last step's loss, kept in the checkpoint: stopped again before a step after a resume, the
    # partial result still reports a finite loss (NaN is refused as a metric)
    loss_value = float(ck.get("loss", "nan")) if ck is not None else float("nan")
    step = start
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


def evaluate(state: ModelState | Mapping[str, torch.Tensor] | nn.Module) -> float:
    """Accuracy on the 360 held-out test images."""
    if isinstance(state, nn.Module):
        net = state
    else:
        net = model()
        net.load_state_dict(dict(state))
    x, y = load_split("test")
    net.eval()
    with torch.no_grad():
        pred = net(x).argmax(dim=1)
    return float((pred == y).float().mean())
