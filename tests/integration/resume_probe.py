"""The throttled digits trainer, saying where each unit starts (``unit U lease L starts at step N``),
so a test can see that a replacement worker picked the unit up from its checkpoint.

Loaded by worker processes as ``resume_probe:train`` with ``--app-dir`` pointing here.
"""

from __future__ import annotations

import logging

from slow_digits import train as slow_train

from vcasync.trainer import TrainContext, TrainResult

log = logging.getLogger("vcasync.worker")


def train(ctx: TrainContext) -> TrainResult:
    ck = ctx.load_checkpoint()
    start = int(ck["step"]) if ck is not None else 0
    log.info("unit %s lease %s starts at step %d", ctx.unit.unit_id, ctx.lease_id, start)
    return slow_train(ctx)
