"""A trainer that checkpoints every step and, when ``HOLD_AT`` is set, holds (as if training on) once
it has saved the checkpoint of that step, so a test can look at the worker's stored checkpoints and
kill it there. It logs where each lease starts (``unit U lease L starts at step N``).

Loaded by worker processes as ``hold_trainer:train`` with ``--app-dir`` pointing here.
"""

from __future__ import annotations

import logging
import os

import torch

from vcasync.trainer import TrainContext, TrainResult

log = logging.getLogger("vcasync.worker")


def model() -> torch.nn.Module:
    return torch.nn.Linear(2, 1)


def train(ctx: TrainContext) -> TrainResult:
    hold_at = int(os.environ.get("HOLD_AT", "-1"))
    net = model()
    ctx.model.load_into(net)
    ck = ctx.load_checkpoint()
    start = 0
    if ck is not None:
        net.load_state_dict(ck["model"])
        start = int(ck["step"])
    log.info("unit %s lease %s starts at step %d", ctx.unit.unit_id, ctx.lease_id, start)
    for step in range(start, ctx.unit.steps):
        with torch.no_grad():
            net.weight += 0.01
        ctx.report_progress(step + 1, step + 1)
        # the pid makes each machine's checkpoint of a step its own bytes (another digest)
        ctx.save_checkpoint({"model": net.state_dict(), "step": step + 1, "pid": os.getpid()})
        if step + 1 == hold_at:
            log.info("holding after the checkpoint of step %d", step + 1)
            ctx.stop_event.wait()
            return ctx.result(net, steps=step + 1)
    return ctx.result(net, steps=ctx.unit.steps)
