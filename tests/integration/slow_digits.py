"""The digits example trainer, throttled (a few ms per step) so a test can kill a worker mid-unit.

Loaded by the worker processes as ``slow_digits:train`` with ``--app-dir`` pointing here.
"""

from __future__ import annotations

import os
import time
from typing import Any

from vcasync.examples.digits import train as digits_train
from vcasync.trainer import TrainContext, TrainResult

DELAY_S = float(os.environ.get("SLOW_DIGITS_DELAY_S", "0.02"))


def train(ctx: TrainContext) -> TrainResult:
    report = ctx.report_progress

    def slow(*args: Any, **kwargs: Any) -> None:
        time.sleep(DELAY_S)
        report(*args, **kwargs)

    ctx.report_progress = slow  # type: ignore[method-assign]
    return digits_train(ctx)
