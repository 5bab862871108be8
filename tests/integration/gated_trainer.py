"""A trainer that holds its unit until a file exists (the path in ``GATED_TRAINER_GATE``), then returns
the model as it got it: the test decides to the moment when the run's last unit is delivered. Loaded by
worker processes as ``gated_trainer:train`` with ``--app-dir`` pointing here. With ``GATED_TRAINER_DEAF``
set it ignores ``ctx.should_stop`` too (a trainer slow to stop), holding on until the gate opens."""

from __future__ import annotations

import os
import time
from pathlib import Path

from vcasync.trainer import TrainContext, TrainResult


def train(ctx: TrainContext) -> TrainResult:
    gate = Path(os.environ["GATED_TRAINER_GATE"])
    deaf = bool(os.environ.get("GATED_TRAINER_DEAF"))
    while not gate.exists() and (deaf or not ctx.should_stop):
        time.sleep(0.02)
    return ctx.result(ctx.model)
