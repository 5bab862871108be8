"""A tiny model and a throttled trainer for the storage-outage tests.

Loaded by ``vcasync coordinator --model outage_app:model`` and ``vcasync worker --trainer
outage_app:train`` with ``--app-dir`` pointing here. ``OUTAGE_STEP_S`` sets the seconds per step, so
a test can break the storage while units are being trained.
"""

from __future__ import annotations

import os
import time

import torch

from vcasync.trainer import TrainContext, TrainResult


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(4, 2)


def train(ctx: TrainContext) -> TrainResult:
    delay = float(os.environ.get("OUTAGE_STEP_S", "0.02"))
    tensors = {k: v.clone() for k, v in ctx.model.items()}
    for step in range(ctx.unit.steps):
        if ctx.should_stop:
            return ctx.result(tensors, steps=step, samples=step)
        time.sleep(delay)
        for t in tensors.values():
            t.add_(0.001)
        ctx.report_progress(step + 1, step + 1)
    return ctx.result(tensors, steps=ctx.unit.steps, samples=ctx.unit.steps)
