"""A trainer that ignores ``ctx.should_stop`` (sleeps a minute): the worker must give up on it after its
grace period. Loaded by worker processes as ``stubborn_trainer:train`` with ``--app-dir`` pointing here.
"""

from __future__ import annotations

import time

from vcasync.trainer import TrainContext, TrainResult


def train(ctx: TrainContext) -> TrainResult:
    time.sleep(60)
    return ctx.result(ctx.model)
